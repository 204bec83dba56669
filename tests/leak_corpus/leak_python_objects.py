"""LEAK, not tensors: Python objects (raw bytes) pile up; tensor bytes stay flat."""

from _common import STEPS, batch, train_step

log = []
for _step in range(STEPS):
    train_step(*batch())
    log.append(bytearray(b"x" * (2 << 20)))  # 2 MiB of touched Python memory per step

"""A training loop that serves itself to torchmem viewers (torchmem.serve())."""

import argparse
import sys
import time

import torch

import torchmem

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=0, help="0: until stopped")
parser.add_argument("--sleep", type=float, default=0.02)
parser.add_argument("--fail-at", type=int, default=0)
opts = parser.parse_args()

entry = torchmem.serve()
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
served_buffer = torch.zeros(256, 1024)  # 1 MiB, named by the script's globals
print(f"serving {entry.pid}", flush=True)
step = 0
while opts.steps == 0 or step < opts.steps:
    step += 1
    if step == opts.fail_at:
        raise RuntimeError(f"failed on purpose at step {step}")
    x = torch.randn(16, 32)
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 10 == 0:
        torchmem.mark(f"every ten {step}")
    time.sleep(opts.sleep)
print(f"finished {step} steps", flush=True)
sys.exit(0)

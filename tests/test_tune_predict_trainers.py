"""The fake step on the trainers users train with: Hugging Face's ``Trainer`` reads
tensor values before its first backward, which fake tensors do not have; Lightning's
logs the loss through a deep copy of a metric's state and moves the model back to the
CPU as the step's end unwinds. With stand-ins each step is predicted, and the prediction
is held against the same step run for real."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from torchmem.tuning.predict import predict
from torchmem.tuning.trial import TrialPlan

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).parent / "scripts"

#: The same step for real, its live tensor bytes counted by the same dispatch mode: the
#: difference is fake execution (stand-in values, no data) against real execution.
REAL_STEP = """
import runpy, sys, torch
from torchmem.tuning.fake_step import StepEnded, _live_bytes_mode
script, batch, out = sys.argv[1:4]
counter = _live_bytes_mode()
backward = torch.autograd.backward
def ended(*args, **kwargs):
    backward(*args, **kwargs)
    raise StepEnded()
torch.autograd.backward = ended
sys.argv = [script, "--batch-size", batch, "--out", out]
try:
    with counter:
        runpy.run_path(script, run_name="__main__")
except StepEnded:
    print(counter.peak)
"""


def real_peak(script: Path, batch: int, tmp_path: Path) -> int:
    r = subprocess.run(
        [sys.executable, "-c", REAL_STEP, str(script), str(batch), str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    return int(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("script", "needs"),
    [("hf_trainer.py", ("transformers", "accelerate")), ("lightning_trainer.py", ("lightning",))],
    ids=["hugging-face", "lightning"],
)
def test_a_trainer_step_is_predicted_within_15_percent_of_the_step_run(script, needs, tmp_path):
    for module in needs:
        pytest.importorskip(module)
    path = SCRIPTS / script
    plan = TrialPlan(str(path), ("--out", str(tmp_path / "out")), "--batch-size")
    prediction = predict(plan, 1, 64, limit=100 << 30)
    assert prediction.error is None, prediction.error
    assert [b for b, _ in prediction.points] == [1, 8, 23, 64]  # 23: between the top two
    # Each reads its sampler's permutation (and HF its token count): said, not hidden.
    assert any("int64 value read before backward" in c for c in prediction.caveats)
    predicted = dict(prediction.points)
    assert predicted[64] > 4 * predicted[8]  # the activations grow with the batch
    for batch in (8, 64):
        measured = real_peak(path, batch, tmp_path)
        assert predicted[batch] == pytest.approx(measured, rel=0.15), (batch, measured)

"""Tuning a user can trust, through the command line: on a script whose identical runs
peak tens of MiB apart, the answer fits every plain run and three tunings agree; a script
that never reads its batch option is told so. Apart from test_tune_cli.py so that the
longest tuning test runs beside the others (the test workers take a module each)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import check_summary
from helpers import run_tune as tune

pytestmark = pytest.mark.slow

LINEAR = str(Path(__file__).parent / "scripts" / "linear_memory.py")
MiB = 1 << 20


def plain_peak_rss(args: list[str]) -> int:
    """The peak RSS of ``python LINEAR args`` run as a user would, without torchmem: the
    kernel's figure for that child (what ``/usr/bin/time -f %M`` prints), in bytes."""
    proc = subprocess.Popen([sys.executable, LINEAR, *args], stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0
    return usage.ru_maxrss * 1024


# Three tunings and five plain runs, each a fresh torch process: 195-223 s in clean-clone
# runs on this 2-core VM, and once past the 240 s default while the plain runs ran.
@pytest.mark.timeout(480)
def test_a_noisy_script_is_tuned_to_a_size_every_plain_run_fits_and_tunings_agree(tmp_path):
    # --noise: identical runs peak up to 48 MiB apart, as glibc's heap makes them.
    base = plain_peak_rss(["--steps", "2", "--batch-size", "1"])
    budget = base + 1000 * MiB
    recommended: list[int] = []
    trials: list[list[tuple]] = []
    for i in range(3):
        out = tmp_path / f"tune{i}.json"
        r = tune("--budget", str(budget), "--summary", str(out), LINEAR, "--noise",
                 "--steps", "6")  # fmt: skip
        assert r.returncode == 0, r.stderr
        data = check_summary(json.loads(out.read_text()))
        assert data["effect"] == "grows" and data["noise"]["runs"] >= 2
        assert "noise: identical runs differ by up to" in r.stderr
        recommended.append(data["recommended"])
        trials.append([(t["batch_size"], t["role"], t["peak_bytes"]) for t in data["trials"]])
    # Five plain runs of the user's own command at the first answer stay under the budget.
    peaks = [
        plain_peak_rss(["--noise", "--steps", "6", "--batch-size", str(recommended[0])])
        for _ in range(5)
    ]
    assert max(peaks) <= budget, ([p / MiB for p in peaks], budget / MiB)
    # Three tunings of the same script, settings and machine agree within 10%.
    assert max(recommended) <= 1.1 * min(recommended), (recommended, trials)


def test_a_script_that_never_reads_its_batch_option_is_told_so(tmp_path):
    out = tmp_path / "tune.json"
    r = tune("--budget", "2GiB", "--summary", str(out), LINEAR, "--ignore-batch")
    assert r.returncode == 0, r.stderr
    data = check_summary(json.loads(out.read_text()))
    assert data["effect"] == "none" and data["recommended"] is None
    assert "does not seem to read --batch-size" in r.stderr
    assert "run it:" not in r.stderr  # no command line with a size nobody can justify
    # Seven trials where identical runs agree within a glibc chunk; where they scatter
    # more (a loaded machine: 1, 2, 32, 1, 256, 2048, ... in a CI run), the leap to the
    # range's top is capped by the slope the noise allows, one probe more on the way.
    assert len(data["trials"]) <= 8, [t["batch_size"] for t in data["trials"]]

"""The benchmarks and the GPU check script still run: they are not exercised elsewhere,
and a rename in core would otherwise break them silently until someone needs them."""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


@pytest.mark.timeout(600)  # every benchmark at its least: ~1 min here, more under load
def test_the_smoke_benchmark_run_reports_every_benchmark_in_one_table(tmp_path):
    logs = tmp_path / "logs"
    env = {"TORCHMEM_RUNTIME_DIR": str(tmp_path), "QT_QPA_PLATFORM": "offscreen"}
    r = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--smoke", "--logs", str(logs)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, **env},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    out = r.stdout
    assert "smoke run" in out and "figure" in out and "how it was measured" in out
    for figure in (
        "step time, the sampler alone (10 Hz)",
        "step time, torchmem defaults",
        "step time, agent + connected viewer",
        "sample-to-plot latency p99 (local socket)",
        "step time, recording (vs torchmem defaults)",
        "census / bare gc pass",
        "reopen a 1 h recording: first drawn frame",
        "log flood: the window / torchmem run",
        "redraw, 8 traces of 100,000 samples",
        "cold start: command to first drawn frame",
        "window RSS after a simulated week",
        "snapshot: reopen from the index",
        "snapshot: the window's plot panned",
        "tuning, torchmem (fit + verify): trials / OOMs / worst found",
    ):
        assert figure in out, f"{figure!r} missing from:\n{out}"
    assert "failed" not in out
    if Path("/usr/sbin/sshd").exists():
        assert "sample-to-plot latency p99 through SSH" in out
    assert re.search(r"\d+ figures, \d+ of \d+ targets met", out)
    # Each benchmark's own detailed output is kept.
    assert "machine:" in (logs / "census.log").read_text()


def _harness():
    """The harness module (``benchmarks/__main__.py``), imported as the command does."""
    sys.path.insert(0, str(ROOT))
    try:
        return importlib.import_module("benchmarks.__main__")
    finally:
        sys.path.remove(str(ROOT))


def test_the_harness_reports_a_benchmark_that_fails_and_refuses_an_unknown_name(tmp_path):
    harness = _harness()
    broken = harness.Bench("broken", "no_such_script.py", "a benchmark that cannot start")
    (row,) = harness.run_bench(broken, "quick", logs=tmp_path, verbose=False)
    assert row["value"] == "failed" and row["met"] is False and "exit 2" in row["how"]
    r = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--only", "nonsense"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2 and "unknown benchmark 'nonsense'" in r.stderr


def test_a_logs_folder_used_twice_reports_each_figure_once(tmp_path):
    harness = _harness()
    script = tmp_path / "one_row.py"
    script.write_text(
        "import json, os\n"
        "with open(os.environ['TORCHMEM_BENCH_ROWS'], 'a') as f:\n"
        "    f.write(json.dumps({'figure': 'f', 'value': '1', 'target': '', 'met': None,"
        " 'how': ''}) + '\\n')\n"
    )
    bench = harness.Bench("one", str(script), "a benchmark of one figure")
    logs = tmp_path / "logs"
    logs.mkdir()
    for _ in range(2):
        rows = harness.run_bench(bench, "quick", logs=logs, verbose=False)
        assert [r["figure"] for r in rows] == ["f"]


def test_gpu_check_runs_without_a_gpu_and_its_snippets_name_real_modules():
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--out", "."],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and "no CUDA device" in r.stdout, r.stderr[-2000:]
    # The checks themselves need a GPU; what can rot without one is the code they run in
    # child processes: every snippet must compile and import names that exist.
    tree = ast.parse((ROOT / "scripts" / "gpu_check.py").read_text())
    snippets = [
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) == "python"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    ]
    assert len(snippets) >= 2
    for code in snippets:
        compile(textwrap.dedent(code), "<gpu_check snippet>", "exec")
    # Every torchmem name the script imports, in any snippet, still exists.
    text = (ROOT / "scripts" / "gpu_check.py").read_text()
    imports = re.findall(r"^\s*from (torchmem[\w.]*) import ([\w, ]+)$", text, re.M)
    assert len(imports) >= 4
    for module, names in imports:
        loaded = importlib.import_module(module)
        for name in names.split(","):
            assert hasattr(loaded, name.strip()), f"{module}.{name.strip()}"

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


@pytest.mark.parametrize(
    ("script", "args", "expect"),
    [
        ("benchmarks/sampler_overhead.py", ["--blocks", "1", "--steps", "3"], "torchmem defaults"),
        (
            "benchmarks/census_speed.py",
            ["--tensors", "300", "--objects", "3000", "--repeat", "1"],
            "census",
        ),
        ("benchmarks/tune_search.py", ["--quick"], "torchmem (fit + verify)"),
        ("benchmarks/reopen_window.py", ["--hours", "0.01"], "first drawn frame"),
        ("benchmarks/snapshot_open.py", ["--events", "2000"], "from the index"),
        ("benchmarks/log_flood.py", ["--lines", "2000"], "the window"),
        (
            "benchmarks/record_overhead.py",
            ["--blocks", "1", "--steps", "3", "--hours", "0.01"],
            "defaults + recording",
        ),
        (
            "benchmarks/agent_overhead.py",
            ["--blocks", "1", "--steps", "3", "--parts", "1"],
            "agent",
        ),
    ],
)
def test_benchmark_runs_in_a_tiny_size_and_prints_its_table(script, args, expect, tmp_path):
    env = {"TORCHMEM_RUNTIME_DIR": str(tmp_path), "QT_QPA_PLATFORM": "offscreen"}
    r = subprocess.run(
        [sys.executable, str(ROOT / script), *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT / "benchmarks",
        env={**os.environ, **env},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "machine:" in r.stdout and expect in r.stdout.lower(), r.stdout


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

"""core/ must never load Qt: it runs inside users' training processes."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT, SCRIPTS

# Starts torchmem, agent or training processes (conftest checks the mark).
pytestmark = pytest.mark.slow

QT = ("PySide6", "pyqtgraph", "shiboken6", "superqt")


def test_import_torchmem_loads_no_qt():
    code = (
        "import sys, torchmem, torchmem.cli.main, torchmem.cli.run, torchmem.sources.inprocess\n"
        "torchmem.mark('outside torchmem: a no-op')\n"
        f"bad = [m for m in sys.modules if m.split('.')[0] in {QT!r}]\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, f"Qt modules loaded by import torchmem: {out.stdout}{out.stderr}"


def test_headless_run_loads_no_qt():
    out = subprocess.run(
        [sys.executable, "-m", "torchmem", "run", "--quiet", str(SCRIPTS / "qt_check.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "qt loaded: False" in out.stdout


def test_import_contract_holds():
    lint = ROOT / ".venv" / "bin" / "lint-imports"
    exe = str(lint) if lint.exists() else "lint-imports"
    out = subprocess.run([exe], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "KEPT" in out.stdout

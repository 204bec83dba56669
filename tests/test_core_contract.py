"""core/ must never load Qt: it runs inside users' training processes. The window never
imports the command line: both are front ends of the library below them."""

from __future__ import annotations

import ast
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
    # The contracts cover the GUI (through core/gui, a link to gui/): without it, import-
    # linter read core/ alone and any GUI import passed unseen.
    import grimp

    modules = grimp.build_graph("torchmem").modules
    assert {"torchmem.gui.windows.main_window", "torchmem.gui.plots.trace_plot"} <= modules


def test_the_window_never_imports_the_command_line():
    # Also held by the layers contract; read here too for imports that import-linter
    # cannot see (a module named in a string), lazy ones in functions as well.
    found = []
    for path in sorted((ROOT / "gui").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            found += [
                f"{path.name}:{node.lineno} {n}" for n in names if n.startswith("torchmem.cli")
            ]
    assert not found, "the window imports the command line:\n" + "\n".join(found)

"""The command line: headless runs with summaries, exit codes, and argument splitting."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT, SCRIPTS
from helpers import check_summary

from torchmem.cli.main import gui_parser, main
from torchmem.resources import demo_script

# Starts torchmem, agent or training processes (conftest checks the mark).
pytestmark = pytest.mark.slow


def torchmem(*args, timeout=240):
    return subprocess.run(
        [sys.executable, "-m", "torchmem", *args], capture_output=True, text=True, timeout=timeout
    )


def test_run_demo_writes_a_summary(tmp_path):
    out = tmp_path / "summary.json"
    proc = torchmem(
        "run",
        "--summary",
        str(out),
        str(demo_script()),
        "--epochs",
        "2",
        "--steps",
        "6",
        "--batch-size",
        "8",
    )
    assert proc.returncode == 0, proc.stderr
    assert "demo: finished 12 steps" in proc.stdout, "the script's output is echoed"
    data = check_summary(json.loads(out.read_text()))
    assert data["exit_code"] == 0 and data["status"] == "finished"
    assert data["steps"] == 12
    assert data["samples"] >= 2
    assert data["duration_s"] > 0
    assert data["peak_bytes"]["cpu_rss"] > 50 << 20
    assert data["alerts"] == []
    assert data["argv"] == ["--epochs", "2", "--steps", "6", "--batch-size", "8"]
    assert "12 steps" in proc.stderr and "peaks: RSS" in proc.stderr


def test_run_exits_with_the_scripts_code_and_summarises_failures(tmp_path):
    out = tmp_path / "s.json"
    proc = torchmem("run", "--summary", str(out), str(SCRIPTS / "exit3.py"))
    assert proc.returncode == 3
    assert json.loads(out.read_text())["exit_code"] == 3
    proc = torchmem("run", "--summary", str(out), str(SCRIPTS / "raises_at_import.py"))
    assert proc.returncode == 1
    assert "RuntimeError: boom at import" in proc.stderr
    data = check_summary(json.loads(out.read_text()))
    assert data["status"] == "failed" and "boom at import" in data["traceback"]


def test_run_uses_the_main_thread_so_signals_work():
    proc = torchmem("run", "--quiet", str(SCRIPTS / "uses_signal.py"))
    assert proc.returncode == 0, proc.stderr
    assert "installed a handler" in proc.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "missing.py"], "No such script"),
        (["run", str(SCRIPTS / "notes.txt")], "Syntax error"),
        (["run", str(SCRIPTS)], "is a folder"),
        (["run", "--hz", "500", "x.py"], "between 1 and 100 Hz"),
        (["run"], "give the script to run, e.g. torchmem run train.py"),
    ],
)
def test_run_bad_input_is_explained(args, message):
    proc = torchmem(*args, timeout=60)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_main_py_and_version_work_from_the_checkout():
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "main.py"),
            "run",
            "--quiet",
            str(SCRIPTS / "ok_print.py"),
            "a",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "hello from the script ['a']" in proc.stdout
    assert torchmem("--version", timeout=60).stdout.startswith("torchmem 0.1.0")


def test_options_before_the_script_are_torchmems_after_it_the_scripts():
    opts = gui_parser().parse_args(["--hz", "20", "train.py", "--hz", "5", "--lr", "0.1"])
    assert opts.hz == 20 and opts.script == "train.py"
    assert opts.args == ["--hz", "5", "--lr", "0.1"]


def test_demo_arguments_go_to_the_demo(monkeypatch):
    seen = {}

    class FakeApp:
        @staticmethod
        def main(opts):
            seen.update(vars(opts))
            return 0

    monkeypatch.setattr("importlib.import_module", lambda name: FakeApp)
    assert main(["--demo", "--leak", "--steps", "5"]) == 0
    assert seen["demo"] and seen["args"] == ["--leak", "--steps", "5"]


def test_ps_never_lists_a_viewer_but_lists_a_served_run():
    from torchmem.sources.processes import _is_viewer

    assert _is_viewer(["/usr/bin/python3", "-m", "torchmem", "--demo"])
    assert _is_viewer(["/x/.venv/bin/python", "/x/.venv/bin/torchmem", "train.py"])
    assert _is_viewer(["/x/.venv/bin/python", "/x/.venv/bin/torchmem", "ps"])
    assert not _is_viewer(["python3", "-m", "torchmem", "run", "--attachable", "t.py"])
    assert not _is_viewer(["python", "train.py", "torchmem"])


def test_an_unknown_command_or_a_missing_script_is_a_message_not_a_window(tmp_path):
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "QT_QPA_PLATFORM")}
    for args, what in (
        (["reprot", "x.db"], "no such script or command 'reprot'"),
        (["trian.py"], "no such script 'trian.py'"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "torchmem", *args],
            capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
        )  # fmt: skip
        assert proc.returncode == 2, proc.stderr
        assert what in proc.stderr
        assert "(commands: run, ps, attach, tune, lab, snapshot, " in proc.stderr
        assert "PySide6" not in proc.stderr and "core dump" not in proc.stderr


def test_the_window_without_a_display_names_the_headless_ways(tmp_path):
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "QT_QPA_PLATFORM")}
    env.pop("WAYLAND_DISPLAY", None)
    proc = subprocess.run(
        [sys.executable, "-m", "torchmem", str(SCRIPTS / "ok_print.py")],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "no display" in proc.stderr and "torchmem run SCRIPT" in proc.stderr
    assert "xvfb-run" in proc.stderr and "QT_QPA_PLATFORM=offscreen" in proc.stderr


def test_a_census_that_fails_at_a_step_boundary_never_ends_the_script():
    """The census runs in the script's thread at its step boundaries: when it fails (here a
    module whose children() raises; before, torch.compile's fake tensors), the script
    trains on and exits 0, and the terminal is told once why censuses stopped."""
    proc = torchmem("run", str(SCRIPTS / "census_breaks.py"), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "trained 30 steps" in proc.stdout
    notes = [line for line in proc.stderr.splitlines() if "a census failed" in line]
    assert len(notes) == 1 and "module whose children() raises" in notes[0], proc.stderr
    assert "without automatic censuses for this run" in notes[0]


def _marker_script(tmp_path):
    """A script that leaves a file behind when it runs."""
    script = tmp_path / "marks.py"
    script.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    return str(script)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--cwd", "/nonexist"], "torchmem run: --cwd /nonexist: no such folder"),
        (["run", "--summary", "/nonexist/dir/x.json"], "no such folder: /nonexist/dir"),
        (["run", "--record", "{script}"], "already exists; choose a new file"),
        (["run", "--summary", "{tmp}"], "is a folder; give a file name"),
        (["tune", "--budget", "1GiB", "--summary", "/nonexist/t.json"], "no such folder"),
        (["tune", "--budget", "1GiB", "--cwd", "{script}"], "--cwd {script}: not a folder"),
    ],
)
def test_run_and_tune_check_their_paths_before_any_work(tmp_path, capsys, args, message):
    script = _marker_script(tmp_path)
    fill = lambda text: text.format(script=script, tmp=tmp_path)  # noqa: E731
    with pytest.raises(SystemExit) as ended:
        main([*map(fill, args), script])
    err = capsys.readouterr().err
    assert ended.value.code == 2 and fill(message) in err
    assert err.count("\n") == 1, "one line, not a usage and a traceback"
    assert not (tmp_path / "ran").exists(), "the script must not have run"


def test_report_and_sessions_name_a_wrong_folder(tmp_path, capsys):
    with pytest.raises(SystemExit) as ended:
        main(["report", str(tmp_path)])
    assert ended.value.code == 2
    assert f"`torchmem sessions --dir {tmp_path}`" in capsys.readouterr().err
    with pytest.raises(SystemExit) as ended:
        main(["sessions", "--dir", str(tmp_path / "nowhere")])
    assert ended.value.code == 2 and "no such folder" in capsys.readouterr().err


def test_snapshot_help_describes_its_three_forms(capsys):
    assert main(["snapshot", "--help"]) == 0
    out = capsys.readouterr().out
    for form in ("snapshot FILE", "snapshot info FILE", "snapshot diff A B"):
        assert f"torchmem {form}" in out

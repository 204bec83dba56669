"""One real window on an X server (Xvfb): launch `torchmem --demo`, screenshot it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT
from PySide6.QtGui import QImage

pytestmark = pytest.mark.slow

REQUIRED = os.environ.get("TORCHMEM_REQUIRE_XVFB") == "1"


@pytest.fixture
def display(request):
    """The DISPLAY of pytest-xvfb's virtual screen; CI requires it, elsewhere it may skip."""
    if shutil.which("Xvfb") is None:
        if REQUIRED:
            pytest.fail("Xvfb is not installed: run scripts/setup.sh (installs xvfb)")
        pytest.skip("Xvfb is not installed (scripts/setup.sh installs it)")
    xvfb = request.getfixturevalue("xvfb")
    return f":{xvfb.display}"


def test_demo_in_a_real_window_draws_and_is_screenshotted(display, tmp_path):
    shot = tmp_path / "screenshot.png"
    env = dict(os.environ, DISPLAY=display, QT_QPA_PLATFORM="xcb")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchmem",
            "--screenshot",
            str(shot),
            "--screenshot-after",
            "25",
            "--demo",
            "--epochs",
            "3",
            "--steps",
            "60",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "screenshot saved" in proc.stderr
    image = QImage(str(shot))
    assert not image.isNull() and image.width() >= 800 and image.height() >= 500
    # A real picture, not a blank frame: many distinct colours.
    colours = {
        image.pixel(x, y) for x in range(0, image.width(), 7) for y in range(0, image.height(), 7)
    }
    assert len(colours) > 20
    keep = os.environ.get("TORCHMEM_SCREENSHOT_DIR")
    if keep:
        shutil.copy(shot, os.path.join(keep, "screenshot.png"))


def test_a_display_that_does_not_answer_is_one_line_not_an_abort(display):
    from torchmem.cli.display import display_problem, x_display_answers

    assert x_display_answers(display) is True, "the virtual screen answers"
    silent = next(f":{n}" for n in range(55, 200) if not os.path.exists(f"/tmp/.X11-unix/X{n}"))
    assert x_display_answers(silent) is False
    env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "WAYLAND_DISPLAY")}
    proc = subprocess.run(
        [sys.executable, "-m", "torchmem", "--demo"],
        capture_output=True, text=True, timeout=120, env={**env, "DISPLAY": silent},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"the display {silent} does not answer" in proc.stderr
    assert proc.stderr.count("\n") == 1 and "libxcb-cursor0" not in proc.stderr
    assert display_problem({"DISPLAY": silent, "QT_QPA_PLATFORM": "offscreen"}) is None

"""Bundled resources: the icon, the stylesheet and the demo scripts."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def path(name: str) -> Path:
    """Absolute path of a bundled resource file."""
    return HERE / name


def demo_script() -> Path:
    """The bundled demo: a small CNN training on synthetic data (``--leak`` to leak)."""
    return HERE / "examples" / "demo_train.py"

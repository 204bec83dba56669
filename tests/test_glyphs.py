"""Every character the window can show is one its font has: a missing glyph is drawn as
an empty box ("⧉ separate process" was)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtGui import QFontMetrics

ROOT = Path(__file__).resolve().parent.parent


def test_every_non_ascii_character_in_the_gui_and_its_messages_has_a_glyph(qapp):
    metrics = QFontMetrics(qapp.font())
    missing = {}
    for source in sorted(
        [*ROOT.joinpath("gui").rglob("*.py"), *ROOT.joinpath("core").rglob("*.py")]
    ):
        for n, line in enumerate(source.read_text().splitlines(), 1):
            for ch in line:
                if ord(ch) > 127 and not metrics.inFontUcs4(ord(ch)):
                    missing.setdefault(ch, f"{source.relative_to(ROOT)}:{n}")
    assert not missing, f"no glyph in {qapp.font().family()!r} for: {missing}"

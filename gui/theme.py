"""Light, dark or the system's palette, on Qt's Fusion style so both are consistent."""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

THEMES = ("system", "light", "dark")


def _dark_palette() -> QPalette:
    p = QPalette()
    window, base, text = QColor(37, 37, 40), QColor(28, 28, 30), QColor(225, 225, 228)
    p.setColor(QPalette.Window, window)
    p.setColor(QPalette.WindowText, text)
    p.setColor(QPalette.Base, base)
    p.setColor(QPalette.AlternateBase, window)
    p.setColor(QPalette.ToolTipBase, QColor(50, 50, 54))
    p.setColor(QPalette.ToolTipText, text)
    p.setColor(QPalette.Text, text)
    p.setColor(QPalette.Button, QColor(48, 48, 52))
    p.setColor(QPalette.ButtonText, text)
    p.setColor(QPalette.BrightText, QColor(255, 90, 90))
    p.setColor(QPalette.Highlight, QColor(42, 130, 218))
    p.setColor(QPalette.HighlightedText, QColor(255, 255, 255))
    p.setColor(QPalette.PlaceholderText, QColor(140, 140, 145))
    p.setColor(QPalette.Link, QColor(108, 182, 255))
    for role in (QPalette.Text, QPalette.ButtonText, QPalette.WindowText):
        p.setColor(QPalette.Disabled, role, QColor(120, 120, 125))
    return p


def apply_theme(app: QApplication, theme: str) -> None:
    """Apply ``"system"``, ``"light"`` or ``"dark"`` to the whole application."""
    app.setStyle("Fusion")
    if theme == "dark":
        app.setPalette(_dark_palette())
    elif theme == "light":
        app.setPalette(app.style().standardPalette())
    else:
        app.setPalette(QPalette())


def follow_palette(view: pg.GraphicsView) -> None:
    """Draw a plot widget in its palette: the background of a text field, axes, tick
    labels and legend entries in the text colour (pyqtgraph's own black, with grey axes,
    sat in a light window as a dark hole, and its legends' light grey text was hard to
    read on a light one). Entries added to a legend later take the same colour."""
    palette = view.palette()
    text = palette.color(QPalette.Text)
    view.setBackground(palette.color(QPalette.Base))
    for item in view.scene().items():
        if isinstance(item, pg.AxisItem):
            item.setPen(pg.mkPen(text))
            item.setTextPen(pg.mkPen(text))
        elif isinstance(item, pg.LegendItem):
            # setLabelTextColor only records the colour: each label is re-rendered by setText.
            item.setLabelTextColor(text)
            for _, label in item.items:
                label.setText(label.text, color=text.name())

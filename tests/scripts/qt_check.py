import sys

print("qt loaded:", any(m.split(".")[0] in ("PySide6", "pyqtgraph", "shiboken6") for m in sys.modules))

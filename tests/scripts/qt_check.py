import sys

QT = ("PySide6", "pyqtgraph", "shiboken6")
print("qt loaded:", any(m.split(".")[0] in QT for m in sys.modules))

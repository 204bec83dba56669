"""torchmem's Qt views (PySide6 + pyqtgraph). Thin: they read the core Session."""

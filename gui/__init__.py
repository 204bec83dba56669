"""torchmem's Qt views (PySide6 + pyqtgraph). Thin: they read the core Session.

Here, what the parts share: the application (``app``), the bridge from the Session to the
GUI thread (``bridge``), the view state the views bind to (``view_state``), actions as
data (``actions``), the run lifecycle (``run_controller``, ``run_mode``), the worker base
for work in a QThread (``workers``, ``tune_worker``), the theme, form fields (``forms``),
a table model of rows, settings values and the GUI thread's garbage collection
(``gui_gc``). The parts a user sees are in four folders: ``windows``, ``panels`` (the
docks), ``dialogs`` and ``plots``.
"""

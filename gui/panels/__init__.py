"""The docks of the main window: Alerts, Job, Lab, Log, Tensors (with its table model),
Tune and Readings."""

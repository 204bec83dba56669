"""The windows and what they are made of: the main window (its chrome, settings, status bar,
banner, files it opens, lazily built panels, run reports, attaching and recording), the
Compare window and the Snapshot window."""

"""Leak detection: trend statistics, the detector that raises alerts, the culprits it names."""

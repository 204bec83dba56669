"""Batch-size tuning: a few trials in fresh processes, a fitted memory model, a verified size."""

"""PyTorch memory snapshots: read safely, indexed as columns, analysed (no Qt)."""

"""The memory lab: what tensor operations cost in memory and time, measured (no Qt)."""

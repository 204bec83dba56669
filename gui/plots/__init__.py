"""The plots: memory over time (with its markers), the Tune plot, the breakdown and the
allocator's segment map."""

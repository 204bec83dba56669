"""Measuring inside the monitored process: backends, sampler, steps, script runner, commands."""

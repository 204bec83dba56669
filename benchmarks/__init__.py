"""torchmem's benchmarks: ``python -m benchmarks`` (see __main__), or each script alone."""

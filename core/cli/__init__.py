"""The ``torchmem`` command line: argument parsing, the headless front ends, and run summaries."""

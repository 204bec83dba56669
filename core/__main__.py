"""``python -m torchmem`` is the ``torchmem`` command."""

from torchmem.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())

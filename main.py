"""``python main.py ...`` is the ``torchmem`` command, installed or straight from a checkout."""

import importlib.util
import sys
from pathlib import Path


def _map_checkout() -> None:
    """Import core/, gui/ and resources/ as torchmem, torchmem.gui, torchmem.resources."""
    root = Path(__file__).resolve().parent
    for name, folder in (
        ("torchmem", "core"),
        ("torchmem.gui", "gui"),
        ("torchmem.resources", "resources"),
    ):
        spec = importlib.util.spec_from_file_location(
            name, root / folder / "__init__.py", submodule_search_locations=[str(root / folder)]
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)


if __name__ == "__main__":
    if importlib.util.find_spec("torchmem") is None:
        _map_checkout()
    from torchmem.cli.main import main

    sys.exit(main())

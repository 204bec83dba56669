"""torchmem's startup hook for ``torchmem run -- COMMAND``: an agent in every torch process.

``torchmem run -- torchrun --nproc_per_node=2 train.py`` puts this folder first on
PYTHONPATH and sets TORCHMEM_AUTOSERVE=1, so every Python process the command starts
runs this file at startup. It only watches for ``import torch``: a process that never
imports torch is left alone, and one that does gets ``torchmem.serve()`` right after
torch has loaded (the torchrun launcher itself is skipped: its workers are the ranks).
With TORCHMEM_MAX_STEPS=N (``torchmem run --max-steps N -- COMMAND``), each such process
exits with code 0 at the end of its N-th step.
A sitecustomize of the user's further down the path still runs.
"""

import os
import sys


def _is_launcher() -> bool:
    argv = getattr(sys, "orig_argv", sys.argv)
    text = " ".join(argv[:4])
    return (
        "torch.distributed.run" in text
        or "torch.distributed.launch" in text
        or any(os.path.basename(a) == "torchrun" for a in argv[:2])
    )


def _serve() -> None:
    try:
        from torchmem.serve import serve

        hz = float(os.environ.get("TORCHMEM_HZ", "10"))
        steps = int(os.environ.get("TORCHMEM_MAX_STEPS") or 0) or None
        serve(hz=hz, max_steps=steps)
    except Exception as exc:  # monitoring must never break the user's program
        sys.stderr.write(f"torchmem: could not start the agent in {os.getpid()}: {exc}\n")


class _TorchImportWatcher:
    """A meta path finder that only wraps the loader of ``torch`` to serve after it."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        import importlib.util

        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        original = spec.loader.exec_module

        def exec_module(module):
            original(module)
            _serve()

        spec.loader.exec_module = exec_module
        return spec


def _chain_user_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    saved_path, saved_module = sys.path[:], sys.modules.pop("sitecustomize", None)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        import sitecustomize  # noqa: F401  (the user's own, if any)
    except ImportError:
        if saved_module is not None:
            sys.modules["sitecustomize"] = saved_module
    finally:
        sys.path[:] = saved_path


if os.environ.get("TORCHMEM_AUTOSERVE") == "1" and not _is_launcher():
    if "torch" in sys.modules:
        _serve()
    else:
        sys.meta_path.insert(0, _TorchImportWatcher())
_chain_user_sitecustomize()

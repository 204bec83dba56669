"""``python -m torchmem.snapshots.worker SNAPSHOT INDEX``: read and index a snapshot in a
process of its own, saying ``progress 0.42`` lines as it goes and ``error MESSAGE`` when
the file cannot be read."""

from __future__ import annotations

import signal
import sys


def main(argv: list[str]) -> int:
    """Index ``argv[0]`` into ``argv[1]``; exit 0, or 1 after an ``error`` line."""
    from torchmem.probe.parent_watch import set_pdeathsig
    from torchmem.snapshots.open import index_snapshot
    from torchmem.snapshots.read import SnapshotError

    set_pdeathsig(signal.SIGKILL)  # a cancelled or closed window ends this reading
    last = [-1.0]

    def progress(share: float) -> None:
        if share - last[0] >= 0.01 or share >= 1:
            last[0] = share
            print(f"progress {share:.3f}", flush=True)

    try:
        index_snapshot(argv[0], argv[1], progress)
    except SnapshotError as exc:
        print(f"error {exc}", flush=True)
        return 1
    except MemoryError:
        print(f"error {argv[0]} does not fit in this machine's memory", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Why a process vanished without a word: the kernel's OOM killer, or something else.

A process killed from outside (SIGKILL from the kernel's OOM killer, ``kill -9``, a
scheduler) runs no handler, so in-process OOM observers never see it. What is left is its
last readings: when the machine's available RAM was nearly gone in the run's last
seconds, the OOM killer is the likely cause, and the message says so with the figures.
"""

from __future__ import annotations

import numpy as np

from torchmem.series import scoped
from torchmem.session import Session
from torchmem.units import format_bytes

#: Available RAM under this share of the machine's total (or under LOW_BYTES) counts as
#: "nearly gone": the kernel starts killing when reclaim cannot keep up, well before zero.
LOW_SHARE = 0.03
LOW_BYTES = 256 << 20
#: How far back from the last reading the low point is looked for (s).
WINDOW_S = 2.0


def oom_killer_hint(session: Session, total_bytes: float | None = None, scope: str = "") -> str:
    """``"; probably the kernel's OOM killer: available RAM fell to 41 MiB …"``, or ``""``.

    ``total_bytes`` is the machine's RAM (psutil's, by default: the reading is only
    meaningful for a process of this machine). ``scope`` picks one process of a job
    (``rank1``): its own readings of the machine and of itself.
    """
    key = scoped(scope, "system/available")
    keys = session.keys()
    if key not in keys:
        return ""
    t, available = session.arrays(key)
    if not len(t):
        return ""
    recent = available[t >= t[-1] - WINDOW_S]
    low = float(np.min(recent))
    if total_bytes is None:
        import psutil

        total_bytes = float(psutil.virtual_memory().total)
    if low > max(LOW_SHARE * total_bytes, LOW_BYTES):
        return ""
    rss = ""
    if (rss_key := scoped(scope, "cpu/rss")) in keys:
        _, values = session.arrays(rss_key)
        if len(values):
            rss = f", the process's RSS was {format_bytes(float(values[-1]))}"
    return (
        f"; probably the kernel's OOM killer: available RAM fell to {format_bytes(low)} of "
        f"{format_bytes(total_bytes)} in its last seconds{rss} (dmesg says for sure: "
        "`dmesg | grep -i 'killed process'`)"
    )

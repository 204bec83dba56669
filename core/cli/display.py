"""Whether the window can open here, asked before Qt is: Qt's xcb plugin aborts the
process (exit 134, a core dump) on a display that does not answer, and its message blames
a missing ``libxcb-cursor0``. One line from us instead, with what to do.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping

#: What to do without a display, said after the reason.
HEADLESS_WAYS = (
    "Headless: `torchmem run SCRIPT` (or `torchmem attach PID`); a virtual screen: "
    "`xvfb-run -a torchmem ...` (what `make demo` does); or QT_QPA_PLATFORM=offscreen for a "
    "window nobody sees."
)


def x_display_answers(display: str) -> bool | None:
    """True when an X server accepts a connection at ``display``, False when none does,
    None when it cannot be asked here (no libxcb: Qt's xcb plugin would not load either,
    and says so itself)."""
    try:
        # By its soname: find_library would run `ldconfig -p` (a process, at start-up).
        xcb = ctypes.CDLL("libxcb.so.1")
    except OSError:
        return None
    xcb.xcb_connect.restype = ctypes.c_void_p
    xcb.xcb_connect.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    xcb.xcb_connection_has_error.argtypes = [ctypes.c_void_p]
    xcb.xcb_disconnect.argtypes = [ctypes.c_void_p]
    connection = xcb.xcb_connect(display.encode(), None)
    try:
        return connection is not None and xcb.xcb_connection_has_error(connection) == 0
    finally:
        if connection is not None:
            xcb.xcb_disconnect(connection)  # also frees the error object of a failed one


def display_problem(env: Mapping[str, str] | None = None) -> str | None:
    """Why the window cannot open here, in one line; None when it can, or when only Qt
    can tell (another system, a platform chosen by hand, Wayland)."""
    env = os.environ if env is None else env
    if not sys.platform.startswith("linux"):
        return None
    platform = env.get("QT_QPA_PLATFORM", "")
    if platform and not platform.startswith("xcb"):
        return None  # offscreen, vnc, wayland: chosen by hand
    if env.get("WAYLAND_DISPLAY") and not platform:
        return None
    display = env.get("DISPLAY", "")
    if not display:
        return (
            "torchmem: no display to open the window on (DISPLAY and WAYLAND_DISPLAY are "
            f"unset). {HEADLESS_WAYS}"
        )
    if x_display_answers(display) is False:
        return (
            f"torchmem: the display {display} does not answer (no X server there, or this "
            f"user may not use it: check DISPLAY, or xauth over SSH). {HEADLESS_WAYS}"
        )
    return None

"""Every action of the window as data: text, slot, shortcut and tooltip, in menu order.

A table rather than code, so that the menus, the toolbar, the shortcuts dialog and the
tests all read one list; :meth:`MainWindow._build_actions` turns each row into a QAction.
"""

from __future__ import annotations

from typing import NamedTuple


class ActionSpec(NamedTuple):
    """One action of the window: built by :meth:`MainWindow._build_actions` as ``self.<attr>``."""

    attr: str
    text: str
    #: A method of the window, or ``command:NAME`` for a command of probe.commands.COMMANDS.
    slot: str
    shortcut: str | None = None
    tip: str = ""
    checkable: bool = False


#: Every action of the window, in menu order within each menu.
ACTIONS = (
    ActionSpec(
        "act_open",
        "&Open script…",
        "opening.open_script_dialog",
        "Ctrl+O",
        "Choose a Python training script to run",
    ),
    ActionSpec(
        "act_sessions",
        "Recorded &sessions…",
        "recordings.open_dialog",
        "Ctrl+Shift+O",
        "Every run of the window is recorded: open one as it was, rename or delete it",
    ),
    ActionSpec(
        "act_open_snapshot",
        "Open memory sna&pshot…",
        "opening.open_snapshot_dialog",
        "Ctrl+Shift+M",
        "Read a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot), however large: "
        "active memory over time by kind, what was live at any moment and which line "
        "allocated it, the allocator's segments. Files can also be dropped on the window",
    ),
    ActionSpec(
        "act_export",
        "&Export the run…",
        "recordings.export",
        "Ctrl+Shift+E",
        "Save the run shown: every sample as CSV (a column per trace), the traces as PNG or "
        "SVG, or its JSON summary",
    ),
    ActionSpec(
        "act_demo",
        "Open the &demo",
        "opening.open_demo",
        None,
        "Run the bundled demo: a small CNN on synthetic data",
    ),
    ActionSpec(
        "act_run",
        "&Run",
        "run",
        "F5",
        "Run the script in a background thread",
    ),
    ActionSpec(
        "act_stop",
        "&Stop",
        "stop",
        "Shift+F5",
        "Stop the script at its next step (forced after 2 s; a separate process blocked "
        "in a C call, such as sleep, is terminated after 7 s)",
    ),
    ActionSpec(
        "act_rerun",
        "R&e-run",
        "rerun",
        "Ctrl+R",
        "Stop if running, then run again",
    ),
    ActionSpec(
        "act_abandon",
        "A&bandon the run",
        "abandon_run",
        None,
        "Let go of a script that does not stop because it is blocked in a C call: the window "
        "is free again, the script's thread ends when the call returns, and the next run "
        "goes to a separate process",
    ),
    ActionSpec(
        "act_quit",
        "&Quit",
        "close",
        "Ctrl+Q",
        "Stop the script and quit",
    ),
    ActionSpec(
        "act_isolated",
        "Run in a separate &process",
        "_toggle_isolated",
        None,
        "Run scripts as `torchmem run` in a child process and attach to it: for scripts that "
        "use signals, spawn DataLoader workers or need allocator settings; a crash there "
        "never takes the window",
        checkable=True,
    ),
    ActionSpec(
        "act_allocator",
        "A&llocator settings…",
        "edit_allocator_settings",
        None,
        "PYTORCH_CUDA_ALLOC_CONF for the next runs (expandable_segments, max_split_size_mb, "
        "garbage_collection_threshold); they run in a separate process, which reads them "
        "before its allocator starts, and the recording notes them",
    ),
    ActionSpec(
        "act_record",
        "Re&cord every run",
        "recordings.toggle",
        None,
        "Write each run into the sessions folder as it happens (a crash loses at most the "
        "last second); File > Recorded sessions opens them again",
        checkable=True,
    ),
    ActionSpec(
        "act_tune",
        "&Tune the batch size…",
        "panels.open_tune",
        "Ctrl+B",
        "Find the largest batch size that fits a memory budget: a few trials in separate "
        "processes, a fitted memory model, a verified recommendation",
    ),
    ActionSpec(
        "act_lab",
        "Memory &lab…",
        "panels.open_lab",
        "Ctrl+L",
        "Measure what tensor operations cost in memory and time across sizes: add vs "
        "add_, views vs copies, matmul, your own expressions, what backward keeps",
    ),
    ActionSpec(
        "act_attach",
        "&Attach to a process…",
        "attaching.open_dialog",
        "Ctrl+Shift+A",
        "Show a running process: one with torchmem.serve() or started by `torchmem run "
        "--attachable` (everything), or any torch process (RSS and GPU memory)",
    ),
    ActionSpec(
        "act_inject",
        "&Inject the agent (experimental)",
        "attaching.inject_agent",
        None,
        "Start torchmem's agent inside the watched process (gdb on Python < 3.14, "
        "sys.remote_exec on 3.14), for steps, tensors, alerts and commands",
    ),
    ActionSpec(
        "act_detach",
        "&Detach",
        "detach",
        "Ctrl+Shift+D",
        "Stop showing the attached process; it carries on",
    ),
    ActionSpec(
        "act_gc",
        "gc.collect()",
        "command:gc_collect",
        "Ctrl+G",
        "Run Python's garbage collector and show what it freed",
    ),
    ActionSpec(
        "act_empty",
        "empty_cache()",
        "command:empty_cache",
        "Ctrl+E",
        "Return the accelerator allocator's unused cache to the device",
    ),
    ActionSpec(
        "act_reset",
        "Reset peaks",
        "command:reset_peaks",
        "Ctrl+Shift+P",
        "Start new peak figures from now",
    ),
    ActionSpec(
        "act_history",
        "Record CUDA allocation &history",
        "report.toggle_history",
        None,
        "Record every CUDA allocation and free with its Python stack (the newest 100,000), "
        "for a memory snapshot; slows allocation a little while on",
        checkable=True,
    ),
    ActionSpec(
        "act_snapshot",
        "Save a memory &snapshot (memory_viz)",
        "command:snapshot",
        "Ctrl+Shift+S",
        "Write the CUDA allocator's segments, blocks and recorded history to a file for "
        "https://pytorch.org/memory_viz",
    ),
    ActionSpec(
        "act_census",
        "Take a &census",
        "command:census",
        "Ctrl+Shift+C",
        "List every live tensor by storage, with names",
    ),
    ActionSpec(
        "act_census_diff",
        "Compare two census&es…",
        "recordings.compare_censuses",
        None,
        "Any two censuses of the run shown, by tensor name: what is new, freed and grown "
        "(from the run's session file, which keeps every census)",
    ),
    ActionSpec(
        "act_oom",
        "Explain the &out-of-memory error…",
        "report.show_oom_report",
        None,
        "What the failed allocation asked for, the largest tensors by name when it failed, "
        "and what to try",
    ),
    ActionSpec(
        "act_leak_settings",
        "&Leak detection settings…",
        "edit_leak_settings",
        None,
        "Thresholds and warm-up of leak and capacity alerts",
    ),
    ActionSpec(
        "act_steps",
        "X axis in &steps",
        "view.set_steps",
        "Ctrl+T",
        "Show the X axis in training steps instead of seconds",
        checkable=True,
    ),
    ActionSpec(
        "act_follow",
        "&Follow",
        "view.set_follow",
        "F",
        "Keep the newest data in view",
        checkable=True,
    ),
    ActionSpec(
        "act_pause",
        "&Pause drawing",
        "view.set_paused",
        "Space",
        "Freeze the traces; data is still recorded",
        checkable=True,
    ),
    ActionSpec(
        "act_shortcuts",
        "&Keyboard shortcuts",
        "show_shortcuts",
        "F1",
        "List the keyboard shortcuts",
    ),
    ActionSpec(
        "act_about",
        "&About torchmem",
        "show_about",
        None,
    ),
)

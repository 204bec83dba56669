"""The ``torchmem`` command line.

    torchmem [OPTIONS] [SCRIPT [ARGS...]]          open the window, run SCRIPT in it
    torchmem --demo [DEMO ARGS...]                 open the window on the bundled demo
    torchmem run [OPTIONS] SCRIPT [ARGS...]        headless: run with monitoring, no Qt
    torchmem run [OPTIONS] -- COMMAND...           any command (torchrun), agents in each rank
    torchmem ps [--json]                           processes to attach to
    torchmem attach [OPTIONS] PID                  headless: collect from a running process
    torchmem tune [OPTIONS] SCRIPT|FILE.py:FUNC    the largest batch size that fits a budget
    torchmem lab [OPTIONS]                         what tensor operations cost, measured
    torchmem snapshot FILE | info FILE | diff A B  PyTorch memory snapshots: window, headless
    torchmem report [--json] SESSION               a recorded session's summary, exports
    torchmem sessions [--json]                     the recorded sessions, newest first
    torchmem compare [--json] SESSION SESSION...   recorded runs side by side

torchmem's own options come before the script; everything after the script is the
script's, as with ``python`` itself.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from torchmem.cli.display import display_problem
from torchmem.cli.parsers import (
    attach_parser,
    command_parser,
    compare_parser,
    gui_parser,
    lab_parser,
    ps_parser,
    report_parser,
    run_parser,
    sessions_parser,
    snapshot_diff_parser,
    snapshot_group_parser,
    snapshot_parser,
    tune_parser,
)
from torchmem.cli.paths import check_paths


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed, and its path options checked before any work (one line, exit 2)."""
    return check_paths(parser, parser.parse_args(argv))


def _tune(argv: list[str]) -> int:
    # `--batch-arg --batch-size` would read as two options: join the pair first.
    for i, arg in enumerate(argv[:-1]):
        if arg == "--batch-arg":
            argv[i : i + 2] = [f"--batch-arg={argv[i + 1]}"]
            break
    command: list[str] = []
    if "--" in argv:  # `torchmem tune [OPTIONS] -- torchrun ... train.py`: a job per trial
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
        if not command:
            tune_parser().error("give a command after --, e.g. -- torchrun train.py")
    opts = _parse(tune_parser(), argv)
    if command and opts.script:
        tune_parser().error(f"give either a script ({opts.script}) or a command after --, not both")
    if not command and not opts.script:
        tune_parser().error("give the training script to tune (or -- COMMAND for a job)")
    if opts.min > opts.max:
        tune_parser().error(f"--min {opts.min} is above --max {opts.max}")
    device = opts.device.strip().lower()
    if device == "cuda":
        device = "cuda:0"
    if device != "cpu" and not device.startswith("cuda:"):
        tune_parser().error(f"--device must be cpu or cuda:N, not {opts.device!r}")
    from torchmem.cli.tune import tune_headless

    if command and opts.record_trials:
        tune_parser().error("--record-trials records a script's trials, not a command's")
    return tune_headless(
        command[0] if command else opts.script,
        command[1:] if command else opts.args,
        job=bool(command),
        batch_arg=opts.batch_arg,
        minimum=opts.min,
        maximum=opts.max,
        budget=opts.budget,
        headroom=opts.headroom,
        device=device,
        steps=opts.steps,
        rounding=opts.rounding,
        max_trials=opts.max_trials,
        summary_path=opts.summary,
        cwd=opts.cwd,
        quiet=opts.quiet,
        record_trials=opts.record_trials,
        predict=opts.predict,
    )


def _lab(argv: list[str]) -> int:
    opts = _parse(lab_parser(), argv)
    ops = [o.strip() for o in opts.ops.split(",") if o.strip()] + opts.expr
    try:
        sizes = [int(s) for s in opts.sizes.split(",") if s.strip()]
    except ValueError:
        lab_parser().error(f"--sizes must be integers, e.g. 256,1024,4096, not {opts.sizes!r}")
    from torchmem.cli.lab import lab_headless
    from torchmem.lab.ops import BUILTIN

    unknown = [o for o in opts.ops.split(",") if o.strip() and o.strip() not in BUILTIN]
    if unknown:
        lab_parser().error(
            f"unknown operation {unknown[0]!r}: choose from {', '.join(BUILTIN)}, or give "
            "an expression with --expr"
        )
    split = lambda text: [t.strip() for t in text.split(",") if t.strip()]  # noqa: E731
    return lab_headless(
        ops, sizes, split(opts.dtype), split(opts.device), opts.repeats, opts.grad,
        opts.json, opts.csv, opts.in_process,
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``torchmem`` command; returns the exit code."""
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:
        # `torchmem report ... | head`: the reader left. Python's own advice: point stdout
        # at devnull so that the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _ps(argv: list[str]) -> int:
    from torchmem.cli.ps import ps

    return ps(_parse(ps_parser(), argv))


def _snapshot_info(argv: list[str]) -> int:
    from torchmem.cli.snapshot import info_headless

    opts = _parse(snapshot_parser(), argv)
    return info_headless(opts.file, opts.json, opts.top)


def _snapshot_diff(argv: list[str]) -> int:
    from torchmem.cli.snapshot import diff_headless

    opts = _parse(snapshot_diff_parser(), argv)
    return diff_headless(opts.before, opts.after, opts.json, opts.top)


def _snapshot(argv: list[str]) -> int:
    """``torchmem snapshot FILE`` (the window), ``info``, ``diff``, or the forms' help."""
    if argv[:1] == ["info"]:
        return _snapshot_info(argv[1:])
    if argv[:1] == ["diff"]:
        return _snapshot_diff(argv[1:])
    if argv[:1] in (["-h"], ["--help"]):
        snapshot_group_parser().print_help()
        return 0
    if len(argv) != 1 or argv[0].startswith("-"):
        snapshot_group_parser().error("give one snapshot file: torchmem snapshot FILE")
    if not Path(argv[0]).exists():
        print(f"torchmem: no such file: {argv[0]}", file=sys.stderr)
        return 2
    return _window(["--snapshot", argv[0]])


def _report(argv: list[str]) -> int:
    from torchmem.cli.report import censuses, report

    opts = _parse(report_parser(), argv)
    if opts.censuses or opts.diff:
        return censuses(opts.session, opts.diff)
    return report(opts.session, opts.json, opts.summary, opts.csv, opts.export)


def _compare(argv: list[str]) -> int:
    from torchmem.cli.report import compare

    opts = _parse(compare_parser(), argv)
    if len(opts.sessions) < 2:
        compare_parser().error("give two or more session files to compare")
    return compare(opts.sessions, opts.json)


def _sessions(argv: list[str]) -> int:
    from torchmem.cli.report import sessions

    opts = _parse(sessions_parser(), argv)
    return sessions(opts.dir, opts.json)


def _attach(argv: list[str]) -> int:
    from torchmem.cli.attach import attach_command

    return attach_command(attach_parser(), argv)


def _run(argv: list[str]) -> int:
    """``torchmem run SCRIPT``, or ``torchmem run [OPTIONS] -- COMMAND...`` (any command,
    an agent in each torch process)."""
    if "--" in argv:
        cut = argv.index("--")
        opts = _parse(command_parser(), argv[:cut])
        command = argv[cut + 1 :]
        if not command:
            command_parser().error("give a command after --, e.g. -- torchrun train.py")
        from torchmem.cli.launch import run_command

        return run_command(command, opts.summary, opts.hz, opts.quiet, opts.max_steps)
    opts = _parse(run_parser(), argv)
    if not opts.script:
        run_parser().error("give the script to run, e.g. torchmem run train.py --lr 0.1")
    from torchmem.cli.run import run_headless
    from torchmem.probe.runner import ScriptError, validate_script

    try:
        validate_script(opts.script)
    except ScriptError as exc:
        print(f"torchmem: {exc}", file=sys.stderr)
        return 2
    return run_headless(
        opts.script,
        opts.args,
        opts.summary,
        opts.hz,
        opts.cwd,
        opts.quiet,
        opts.fail_on_leak,
        attachable=opts.attachable or opts.wait_attach > 0,
        listen=opts.listen,
        wait_attach=opts.wait_attach,
        max_steps=opts.max_steps,
        record=opts.record,
        echo=not opts.no_echo,
    )


#: The subcommands and their handlers (each given the arguments after its name).
HANDLERS = {
    "run": _run, "ps": _ps, "attach": _attach, "tune": _tune, "lab": _lab,
    "snapshot": _snapshot, "report": _report, "sessions": _sessions, "compare": _compare,
}  # fmt: skip


def _main(argv: list[str]) -> int:
    handler = HANDLERS.get(argv[0]) if argv else None
    return handler(argv[1:]) if handler is not None else _window(argv)


def _window(argv: list[str]) -> int:
    """The window: its options checked, and the display asked, before Qt is imported."""
    demo_args: list[str] = []
    if "--demo" in argv:
        # `torchmem --demo --leak`: what follows --demo belongs to the demo script.
        cut = argv.index("--demo") + 1
        argv, demo_args = argv[:cut], argv[cut:]
    opts = _parse(gui_parser(), argv)
    if opts.demo:
        if opts.script:
            gui_parser().error("give either --demo or a script, not both")
        opts.args = demo_args
    if opts.attach is not None and (opts.script or opts.demo):
        gui_parser().error("give either --attach PID or a script, not both")
    from torchmem.transport.client import AttachError
    from torchmem.transport.hosts import job_hosts

    try:
        opts.hosts = job_hosts(
            opts.host, opts.hostfile, opts.slurm_job, opts.slurm, opts.remote_command
        )
    except AttachError as exc:
        print(f"torchmem: {exc}", file=sys.stderr)
        return 2
    if opts.hosts and (opts.script or opts.demo or opts.attach_entry):
        gui_parser().error("--host attaches to processes there: leave out the script")
    if len(opts.hosts) > 1 and opts.attach is not None:
        gui_parser().error(
            "a PID names a process of one host: give one --host, or leave out --attach to "
            "show every agent of the hosts (the ranks of a multi-node job)"
        )
    if opts.record and not (opts.script or opts.demo):
        gui_parser().error("--record needs a script (or --demo) to record")
    if opts.script and not Path(opts.script).expanduser().exists():
        # A typo or a command of a later version ("report"), never a window on a script
        # that is not there (without a display, Qt would abort with a core dump).
        command_like = not Path(opts.script).suffix
        print(
            f"torchmem: no such {'script or command' if command_like else 'script'} "
            f"'{opts.script}' (commands: {', '.join(HANDLERS)}; or a Python script to run "
            "in the window)",
            file=sys.stderr,
        )
        return 2
    problem = display_problem()
    if problem:
        print(problem, file=sys.stderr)
        return 2
    # Imported by name so that `import torchmem` (and `torchmem run`) never loads Qt.
    app = importlib.import_module("torchmem.gui.app")
    return app.main(opts)

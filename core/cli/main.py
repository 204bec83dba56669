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

from torchmem import __version__
from torchmem.probe.sampler import MAX_HZ, MIN_HZ


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def _rate(text: str) -> float:
    try:
        hz = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not MIN_HZ <= hz <= MAX_HZ:
        raise argparse.ArgumentTypeError(f"must be between {MIN_HZ:g} and {MAX_HZ:g} Hz")
    return hz


def _script(parser: argparse.ArgumentParser, optional: bool = False) -> None:
    """The options every way of running a script shares, then the script and its args."""
    parser.add_argument("--hz", type=_rate, default=10.0, help="sampling rate, 1-100 Hz (10)")
    parser.add_argument("--cwd", help="working directory for the script (default: unchanged)")
    parser.add_argument("script", nargs="?" if optional else None, help="the script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")


def _outputs(
    parser: argparse.ArgumentParser, what: str, quiet: str = "no closing line unless it fails"
) -> None:
    """``--summary`` and ``--quiet``, shared by the headless commands."""
    parser.add_argument("--summary", metavar="JSON", help=f"write a JSON summary of {what} here")
    parser.add_argument("--quiet", action="store_true", help=quiet)


def gui_parser() -> argparse.ArgumentParser:
    """Parser of the window's command line."""
    p = argparse.ArgumentParser(
        prog="torchmem",
        description="Live monitor for PyTorch memory. Opens a window and runs SCRIPT in it. "
        "Headless: 'torchmem run --help'.",
        epilog="Examples: torchmem train.py --lr 0.1 | torchmem --demo --leak | "
        "torchmem run --summary out.json train.py | torchmem --attach 4242. Commands: "
        "run, ps, attach, tune, lab, snapshot, report, sessions, compare (each with "
        "--help).",
    )
    p.add_argument("--version", action="version", version=f"torchmem {__version__}")
    p.add_argument("--demo", action="store_true", help="run the bundled demo training script")
    p.add_argument(
        "--attach", type=int, metavar="PID", help="show a running process (see `torchmem ps`)"
    )
    p.add_argument(
        "--attach-entry",
        metavar="JSON",
        help="show an agent of another machine: its entry file, reached at --address",
    )
    p.add_argument("--address", metavar="SOCKET", help="the forwarded socket of --attach-entry")
    p.add_argument(
        "--record",
        metavar="FILE",
        help="record the script's run into this new session file (the window records every "
        "run into the sessions folder anyway; this names the file)",
    )
    p.add_argument(
        "--snapshot",
        metavar="PICKLE",
        help="open a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot) in a window "
        "(also `torchmem snapshot FILE`; `torchmem snapshot info FILE` without a window)",
    )
    p.add_argument(
        "--isolated",
        action="store_true",
        help="run the script in a child process (for signals, DataLoader workers, crashes)",
    )
    p.add_argument("--screenshot", metavar="PNG", help=argparse.SUPPRESS)
    p.add_argument("--screenshot-after", type=int, default=20, help=argparse.SUPPRESS)
    _script(p, optional=True)
    return p


def run_parser() -> argparse.ArgumentParser:
    """Parser of ``torchmem run``."""
    p = argparse.ArgumentParser(
        prog="torchmem run",
        description="Run SCRIPT with monitoring and no window; exit with its exit code.",
    )
    _outputs(p, "the run")
    p.add_argument(
        "--fail-on-leak",
        action="store_true",
        help="exit with code 4 when a leak alert fired (for CI), unless the script failed",
    )
    p.add_argument(
        "--attachable",
        action="store_true",
        help="start the agent so that `torchmem attach` and the window can attach to the run",
    )
    p.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help="(implies --attachable) serve on TCP instead of a private Unix socket; anything "
        "but 127.0.0.1 is reachable from other machines: prefer SSH socket forwarding",
    )
    p.add_argument(
        "--wait-attach",
        type=float,
        default=0.0,
        metavar="S",
        help="(implies --attachable) wait up to S seconds for a viewer before starting the "
        "script, so that nothing of a short run is missed",
    )
    p.add_argument(
        "--max-steps",
        type=_positive_int,
        metavar="N",
        help="stop the script cleanly after N training steps, and exit 0 (a quick check)",
    )
    _record(p)
    _script(p)
    return p


def _record(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--record",
        metavar="FILE",
        help="record the run into this new session file as it happens (survives a kill -9 "
        "but for the last second); read it with `torchmem report FILE`",
    )


def report_parser() -> argparse.ArgumentParser:
    """Parser of ``torchmem report``."""
    p = argparse.ArgumentParser(
        prog="torchmem report",
        description="Print the summary of a recorded session (torchmem run --record, or the "
        "window's recordings: see `torchmem sessions`), and export it.",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--summary", metavar="JSON", help="also write the JSON summary here")
    p.add_argument("--csv", metavar="FILE", help="export every sample as CSV, a column per trace")
    p.add_argument(
        "--censuses", action="store_true", help="list the censuses the session holds, numbered"
    )
    p.add_argument(
        "--diff",
        nargs=2,
        type=_positive_int,
        metavar=("A", "B"),
        help="compare census A with census B (numbers from --censuses): the tensors new, "
        "freed and grown, by name",
    )
    p.add_argument("session", help="the session file (.tmsession)")
    return p


def compare_parser() -> argparse.ArgumentParser:
    """Parser of ``torchmem compare``."""
    p = argparse.ArgumentParser(
        prog="torchmem compare",
        description="Put recorded runs side by side: how each ended, duration, steps, step "
        "time, peaks per device (later runs also as a change from the first), alerts and "
        "allocator settings.",
        epilog="Example: torchmem compare before.tmsession after.tmsession",
    )
    p.add_argument("--json", action="store_true", help="print JSON, a row per run")
    p.add_argument("sessions", nargs="+", help="two or more session files")
    return p


def sessions_parser() -> argparse.ArgumentParser:
    """Parser of ``torchmem sessions``."""
    p = argparse.ArgumentParser(
        prog="torchmem sessions",
        description="List recorded sessions, newest first: the window records every run "
        "into a per-user folder ($TORCHMEM_SESSIONS_DIR overrides it).",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--dir", metavar="FOLDER", help="list this folder instead")
    return p


def tune_parser() -> argparse.ArgumentParser:
    """Parser of ``torchmem tune``."""
    p = argparse.ArgumentParser(
        prog="torchmem tune",
        description="Find the largest batch size that fits a memory budget: a few trials "
        "of SCRIPT, each in a fresh process, a fitted memory model, and a verified "
        "recommendation. No trial's out-of-memory error ever reaches this process.",
        epilog="Example: torchmem tune --batch-arg --batch-size --budget 6GiB train.py "
        "--epochs 1   (torchmem's options before the script, the script's after it)",
    )
    p.add_argument(
        "--batch-arg",
        default="--batch-size",
        metavar="OPTION",
        help="the script's batch-size option (default --batch-size); its value is "
        "replaced in the script's arguments, or appended",
    )
    p.add_argument("--min", type=_positive_int, default=1, help="smallest size (1)")
    p.add_argument("--max", type=_positive_int, default=4096, help="largest size (4096)")
    p.add_argument(
        "--budget",
        metavar="SIZE",
        help="memory a trial may use: 6GiB, 512MiB, ... (default: half of the available "
        "RAM on CPU, the device's free memory on CUDA)",
    )
    p.add_argument(
        "--headroom",
        metavar="SIZE|N%",
        help="kept free below the budget (default 10%% on CPU, max(10%%, 1 GiB) on CUDA)",
    )
    p.add_argument(
        "--device",
        default="cpu",
        help="whose memory the budget is on: cpu (peak RSS of the trial) or cuda:N (peak "
        "reserved by the allocator); default cpu",
    )
    p.add_argument(
        "--steps", type=_positive_int, default=3, help="measured steps per trial, after one "
        "warm-up step (3)"
    )  # fmt: skip
    p.add_argument(
        "--rounding",
        choices=("none", "multiple8", "pow2"),
        default="none",
        help="round the recommendation down to a multiple of 8 or a power of two",
    )
    p.add_argument(
        "--max-trials", type=_positive_int, default=10, help="give up after N trials (10)"
    )
    p.add_argument(
        "--record-trials",
        action="store_true",
        help="record each trial as a session (see `torchmem sessions`; compare two with "
        "`torchmem compare`); the recorder's own memory then counts in each trial's peak, "
        "so the recommendation can come out a little lower",
    )
    _outputs(p, "the search and its trials", quiet="no progress or closing lines")
    p.add_argument("--cwd", help="working directory for the script (default: unchanged)")
    p.add_argument("script", help="the training script to tune")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    return p


def _tune(argv: list[str]) -> int:
    # `--batch-arg --batch-size` would read as two options: join the pair first.
    for i, arg in enumerate(argv[:-1]):
        if arg == "--batch-arg":
            argv[i : i + 2] = [f"--batch-arg={argv[i + 1]}"]
            break
    opts = tune_parser().parse_args(argv)
    if opts.min > opts.max:
        tune_parser().error(f"--min {opts.min} is above --max {opts.max}")
    device = opts.device.strip().lower()
    if device == "cuda":
        device = "cuda:0"
    if device != "cpu" and not device.startswith("cuda:"):
        tune_parser().error(f"--device must be cpu or cuda:N, not {opts.device!r}")
    from torchmem.cli.tune import tune_headless

    return tune_headless(
        opts.script,
        opts.args,
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
    )


def snapshot_parser() -> argparse.ArgumentParser:
    """Parser of ``torchmem snapshot info``."""
    p = argparse.ArgumentParser(
        prog="torchmem snapshot info",
        description="Summarise a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot): "
        "the peak of active memory and when, what was live then grouped by the line that "
        "allocated it, and the allocator's segments. Read once in a worker process and "
        "indexed; reopening is instant. `torchmem snapshot FILE` opens it in a window.",
    )
    p.add_argument("file", help="the snapshot pickle")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--top", type=_positive_int, default=10, help="owners to list (10)")
    return p


def snapshot_diff_parser() -> argparse.ArgumentParser:
    """Parser of ``torchmem snapshot diff``."""
    p = argparse.ArgumentParser(
        prog="torchmem snapshot diff",
        description="Compare two memory snapshots (before and after a change): their peaks "
        "of active memory, and what each line that allocated held at each peak.",
    )
    p.add_argument("before", help="the first snapshot")
    p.add_argument("after", help="the second snapshot")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--top", type=_positive_int, default=15, help="lines to list (15)")
    return p


def lab_parser() -> argparse.ArgumentParser:
    """Parser of ``torchmem lab``."""
    from torchmem.lab.ops import BUILTIN

    p = argparse.ArgumentParser(
        prog="torchmem lab",
        description="Measure what tensor operations cost: the new storage each result "
        "owns, the peak extra memory, allocations, whether it is a view, and the median "
        "time, across sizes (n x n inputs). Each row runs in a fresh process.",
        epilog="Operations: " + ", ".join(BUILTIN) + ". Example: torchmem lab --ops "
        "add,add_,matmul --sizes 256,1024,4096 --expr 'torch.sigmoid(a) * b' --grad",
    )
    p.add_argument(
        "--ops", default="add,add_,matmul,view,clone,contiguous",
        help="built-in operations, comma-separated (default: add,add_,matmul,view,clone,"
        "contiguous)",
    )  # fmt: skip
    p.add_argument(
        "--expr", action="append", default=[], metavar="EXPRESSION",
        help="your own expression over a, b, c (n x n tensors), torch, F and checkpoint, "
        "e.g. 'a @ b.T + c'; may repeat",
    )  # fmt: skip
    p.add_argument(
        "--sizes", default="256,1024,2048", help="n of the n x n inputs, comma-separated"
    )
    p.add_argument("--dtype", default="float32", help="dtype(s), comma-separated (compare two)")
    p.add_argument("--device", default="cpu", help="device(s), comma-separated: cpu, cuda:0")
    p.add_argument("--repeats", type=_positive_int, default=5, help="timed repeats (5)")
    p.add_argument(
        "--grad", action="store_true",
        help="inputs require grad: also measure what autograd saves for backward",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--csv", metavar="FILE", help="write the rows as CSV here too")
    p.add_argument(
        "--in-process", action="store_true",
        help="measure in this process instead of a fresh child per row (faster; the "
        "allocator's cache from earlier rows may then hide allocations)",
    )  # fmt: skip
    return p


def _lab(argv: list[str]) -> int:
    opts = lab_parser().parse_args(argv)
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


def command_parser() -> argparse.ArgumentParser:
    """Parser of ``torchmem run [OPTIONS] -- COMMAND`` (the options before ``--``)."""
    p = argparse.ArgumentParser(
        prog="torchmem run [OPTIONS] --",
        description="Run any COMMAND (torchrun, a shell script, python -m ...) with an agent in "
        "every Python process of it that imports torch; exit with its exit code.",
        epilog="Example: torchmem run -- torchrun --nproc_per_node=2 train.py",
    )
    _outputs(p, "the job (every rank)")
    p.add_argument("--hz", type=_rate, default=10.0, help="sampling rate of the agents")
    return p


def ps_parser() -> argparse.ArgumentParser:
    """Parser of ``torchmem ps``."""
    p = argparse.ArgumentParser(
        prog="torchmem ps",
        description="List processes torchmem can attach to: live agents, and your other "
        "Python processes that have torch loaded.",
    )
    p.add_argument("--json", action="store_true", help="print JSON (tokens are never shown)")
    p.add_argument("--agents", action="store_true", help="only processes with an agent")
    return p


def attach_parser() -> argparse.ArgumentParser:
    """Parser of ``torchmem attach``."""
    p = argparse.ArgumentParser(
        prog="torchmem attach",
        description="Collect memory readings from a running process, headless. With an agent "
        "(torchmem.serve(), torchmem run --attachable) everything is collected; without one, "
        "RSS and the GPU memory the driver reports. A torchrun launcher's pid attaches to "
        "every rank.",
    )
    p.add_argument(
        "--duration",
        type=float,
        metavar="S",
        help="seconds to collect (default: until the process ends or Ctrl+C)",
    )
    _outputs(p, "what was collected", quiet="no progress or closing lines")
    p.add_argument("--hz", type=_rate, default=10.0, help="rate when watching from outside")
    p.add_argument(
        "--inject",
        action="store_true",
        help="(experimental) start the agent inside a process that has none, through gdb "
        "(Python < 3.14) or sys.remote_exec; needs permission to trace it",
    )
    p.add_argument(
        "--snapshot",
        action="store_true",
        help="(CUDA) record allocation history while attached, and at the end write a "
        "memory snapshot per process for https://pytorch.org/memory_viz (needs an agent)",
    )
    p.add_argument(
        "--entry",
        metavar="JSON",
        help="an agent entry copied from another machine (agent-PID.json), with --address",
    )
    p.add_argument(
        "--address", metavar="SOCKET", help="where that agent is reached: a forwarded socket"
    )
    _record(p)
    p.add_argument("pid", type=int, nargs="?", help="the process id (see `torchmem ps`)")
    return p


def _ps(argv: list[str]) -> int:
    import json

    from torchmem.sources.processes import list_processes
    from torchmem.units import format_bytes

    opts = ps_parser().parse_args(argv)
    rows = list_processes(include_plain=not opts.agents)
    if opts.json:
        print(json.dumps([r.to_json() for r in rows], indent=2))
        return 0
    if not rows:
        print(
            "No processes to attach to. Start a run with `torchmem run --attachable "
            "SCRIPT`, or add `torchmem.serve()` to a script."
        )
        return 0
    print(f"{'PID':>8}  {'AGENT':<6} {'RANK':<6} {'RSS':>10} {'GPU':>10}  COMMAND")
    for r in rows:
        rank = (
            f"{r.agent.rank}/{r.agent.world_size}" if r.agent and r.agent.rank is not None else "-"
        )
        gpu = format_bytes(r.gpu_bytes) if r.gpu_bytes is not None else "-"
        cmd = " ".join(r.cmdline)[:100]
        agent = "yes" if r.agent else "no"
        print(f"{r.pid:>8}  {agent:<6} {rank:<6} {format_bytes(r.rss):>10} {gpu:>10}  {cmd}")
    return 0


#: The subcommands, for the message about an unknown one.
SUBCOMMANDS = (
    "run", "ps", "attach", "tune", "lab", "snapshot", "report", "sessions", "compare",
)  # fmt: skip


def _has_display() -> bool:
    """True where Qt can open a window: an X or Wayland display, a platform chosen by
    hand (offscreen, vnc), or a system without X (macOS, Windows)."""
    if not sys.platform.startswith("linux"):
        return True
    return any(os.environ.get(v) for v in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``torchmem`` command; returns the exit code."""
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:
        # `torchmem report ... | head`: the reader left. Python's own advice: point stdout
        # at devnull so that the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _main(argv: list[str]) -> int:
    if argv[:1] == ["ps"]:
        return _ps(argv[1:])
    if argv[:1] == ["tune"]:
        return _tune(argv[1:])
    if argv[:1] == ["lab"]:
        return _lab(argv[1:])
    if argv[:2] == ["snapshot", "info"]:
        opts = snapshot_parser().parse_args(argv[2:])
        from torchmem.cli.snapshot import info_headless

        return info_headless(opts.file, opts.json, opts.top)
    if argv[:2] == ["snapshot", "diff"]:
        opts = snapshot_diff_parser().parse_args(argv[2:])
        from torchmem.cli.snapshot import diff_headless

        return diff_headless(opts.before, opts.after, opts.json, opts.top)
    if argv[:1] == ["snapshot"]:
        if len(argv) != 2 or argv[1].startswith("-"):
            snapshot_parser().error("give one snapshot file: torchmem snapshot FILE")
        if not Path(argv[1]).exists():
            print(f"torchmem: no such file: {argv[1]}", file=sys.stderr)
            return 2
        argv = ["--snapshot", argv[1]]
    if argv[:1] == ["report"]:
        from torchmem.cli.report import report

        opts = report_parser().parse_args(argv[1:])
        if opts.censuses or opts.diff:
            from torchmem.cli.report import censuses

            return censuses(opts.session, opts.diff)
        return report(opts.session, opts.json, opts.summary, opts.csv)
    if argv[:1] == ["compare"]:
        from torchmem.cli.report import compare

        opts = compare_parser().parse_args(argv[1:])
        if len(opts.sessions) < 2:
            compare_parser().error("give two or more session files to compare")
        return compare(opts.sessions, opts.json)
    if argv[:1] == ["sessions"]:
        from torchmem.cli.report import sessions

        opts = sessions_parser().parse_args(argv[1:])
        return sessions(opts.dir, opts.json)
    if argv[:1] == ["attach"]:
        opts = attach_parser().parse_args(argv[1:])
        from torchmem.cli.attach import attach_headless, entry_from_file
        from torchmem.transport.client import AttachError

        if opts.duration is not None and opts.duration <= 0:
            attach_parser().error("--duration must be positive")
        entries = None
        if opts.entry:
            try:
                entries = [entry_from_file(opts.entry, opts.address)]
            except AttachError as exc:
                print(f"torchmem: {exc}", file=sys.stderr)
                return 2
        elif opts.pid is None:
            attach_parser().error("give a PID (see `torchmem ps`), or --entry and --address")
        pid = entries[0].pid if entries else opts.pid
        return attach_headless(
            pid,
            opts.duration,
            opts.summary,
            opts.hz,
            opts.quiet,
            entries,
            opts.inject,
            opts.snapshot,
            opts.record,
        )
    if argv[:1] == ["run"] and "--" in argv:
        # `torchmem run [OPTIONS] -- COMMAND...`: any command, an agent in each torch process.
        cut = argv.index("--")
        opts = command_parser().parse_args(argv[1:cut])
        command = argv[cut + 1 :]
        if not command:
            command_parser().error("give a command after --, e.g. -- torchrun train.py")
        from torchmem.cli.launch import run_command

        return run_command(command, opts.summary, opts.hz, opts.quiet)
    if argv[:1] == ["run"]:
        opts = run_parser().parse_args(argv[1:])
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
        )

    demo_args: list[str] = []
    if "--demo" in argv:
        # `torchmem --demo --leak`: what follows --demo belongs to the demo script.
        cut = argv.index("--demo") + 1
        argv, demo_args = argv[:cut], argv[cut:]
    opts = gui_parser().parse_args(argv)
    if opts.demo:
        if opts.script:
            gui_parser().error("give either --demo or a script, not both")
        opts.args = demo_args
    if opts.attach is not None and (opts.script or opts.demo):
        gui_parser().error("give either --attach PID or a script, not both")
    if opts.record and Path(opts.record).exists():
        gui_parser().error(f"--record: {opts.record} already exists; choose a new file")
    if opts.record and not (opts.script or opts.demo):
        gui_parser().error("--record needs a script (or --demo) to record")
    if opts.script and not Path(opts.script).expanduser().exists():
        # A typo or a command of a later version ("report"), never a window on a script
        # that is not there (without a display, Qt would abort with a core dump).
        command_like = not Path(opts.script).suffix
        print(
            f"torchmem: no such {'script or command' if command_like else 'script'} "
            f"'{opts.script}' (commands: {', '.join(SUBCOMMANDS)}; or a Python script to run "
            "in the window)",
            file=sys.stderr,
        )
        return 2
    if not _has_display():
        print(
            "torchmem: no display to open the window on (DISPLAY and WAYLAND_DISPLAY are "
            "unset). Headless: `torchmem run SCRIPT` (or `torchmem attach PID`); a virtual "
            "screen: `xvfb-run -a torchmem ...` (what `make demo` does); or "
            "QT_QPA_PLATFORM=offscreen for a window nobody sees.",
            file=sys.stderr,
        )
        return 2
    # Imported by name so that `import torchmem` (and `torchmem run`) never loads Qt.
    app = importlib.import_module("torchmem.gui.app")
    return app.main(opts)

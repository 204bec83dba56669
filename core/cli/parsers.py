"""The parsers of the ``torchmem`` command line: every option, its help and its checks.

:mod:`torchmem.cli.main` dispatches; this module only describes. Each parser is a
function so that ``--help`` of one command never builds the others.
"""

from __future__ import annotations

import argparse

from torchmem import __version__
from torchmem.probe.sampler import MAX_HZ, MIN_HZ


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1, or a message saying what it got."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def rate(text: str) -> float:
    """An argparse type: a sampling rate in Hz within what the sampler accepts."""
    try:
        hz = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not MIN_HZ <= hz <= MAX_HZ:
        raise argparse.ArgumentTypeError(f"must be between {MIN_HZ:g} and {MAX_HZ:g} Hz")
    return hz


def add_script(parser: argparse.ArgumentParser, optional: bool = False) -> None:
    """The options every way of running a script shares, then the script and its args."""
    parser.add_argument("--hz", type=rate, default=10.0, help="sampling rate, 1-100 Hz (10)")
    parser.add_argument("--cwd", help="working directory for the script (default: unchanged)")
    parser.add_argument("script", nargs="?" if optional else None, help="the script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")


def add_outputs(
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
    add_hosts(
        p,
        "attach on this SSH host: --attach PID there, or (no --attach, repeated) every "
        "agent of the hosts, such as the ranks of a multi-node job",
    )
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
    add_script(p, optional=True)
    return p


def run_parser() -> argparse.ArgumentParser:
    """Parser of ``torchmem run``."""
    p = argparse.ArgumentParser(
        prog="torchmem run",
        description="Run SCRIPT with monitoring and no window; exit with its exit code.",
    )
    add_outputs(p, "the run")
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
        type=positive_int,
        metavar="N",
        help="stop the script cleanly after N training steps, and exit 0 (a quick check)",
    )
    add_record(p)
    # An isolated run's child: its window shows the output (through the agent, and what
    # the capture cannot see through the child's terminal), so nothing is written twice.
    p.add_argument("--no-echo", action="store_true", help=argparse.SUPPRESS)
    # Optional here so that a missing script gets one plain line (argparse would also
    # call the script's arguments required).
    add_script(p, optional=True)
    return p


def add_record(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` the ``--record FILE`` option (a run recorded into a session file)."""
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
        "--export",
        metavar="DIR",
        help="write everything into DIR: samples.csv, summary.json and the memory snapshots "
        "the run took (the plots' PNG and SVG: from the window, File > Export)",
    )
    p.add_argument(
        "--censuses", action="store_true", help="list the censuses the session holds, numbered"
    )
    p.add_argument(
        "--diff",
        nargs=2,
        type=positive_int,
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
        "--epochs 1   (torchmem's options before the script, the script's after it). "
        "A distributed job: torchmem tune [OPTIONS] -- torchrun --nproc_per_node=2 train.py "
        "tunes the per-rank batch so that every rank fits (on cpu, all of them together).",
    )
    p.add_argument(
        "--batch-arg",
        default="--batch-size",
        metavar="OPTION",
        help="the script's batch-size option (default --batch-size); its value is "
        "replaced in the script's arguments, or appended",
    )
    p.add_argument("--min", type=positive_int, default=1, help="smallest size (1)")
    p.add_argument("--max", type=positive_int, default=4096, help="largest size (4096)")
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
        "--steps", type=positive_int, default=3, help="measured steps per trial, after one "
        "warm-up step (3)"
    )  # fmt: skip
    p.add_argument(
        "--rounding",
        choices=("none", "multiple8", "pow2"),
        default="none",
        help="round the recommendation down to a multiple of 8 or a power of two",
    )
    p.add_argument(
        "--max-trials", type=positive_int, default=12, help="give up after N trials (12)"
    )
    p.add_argument(
        "--record-trials",
        action="store_true",
        help="record each trial as a session (see `torchmem sessions`; compare two with "
        "`torchmem compare`); the recorder's own memory then counts in each trial's peak, "
        "so the recommendation can come out a little lower",
    )
    p.add_argument(
        "--no-predict",
        dest="predict",
        action="store_false",
        help="do not predict the memory model first from one step per size under "
        "FakeTensorMode (a second, nothing allocated; then two real trials usually do)",
    )
    add_outputs(p, "the search and its trials", quiet="no progress or closing lines")
    p.add_argument("--cwd", help="working directory for the script (default: unchanged)")
    p.add_argument(
        "script", nargs="?", help="the training script to tune (or, after --, a command)"
    )
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    return p


def snapshot_group_parser() -> argparse.ArgumentParser:
    """Parser of ``torchmem snapshot`` itself: its help names the three forms."""
    return argparse.ArgumentParser(
        prog="torchmem snapshot",
        usage="torchmem snapshot FILE | info FILE [--json] [--top N] | diff A B [--json]",
        description="PyTorch memory snapshots (torch.cuda.memory._dump_snapshot), read in a\n"
        "worker process and indexed on disk, so files too big for memory_viz open.",
        epilog="Forms:\n"
        "  torchmem snapshot FILE       open FILE in the Snapshot window\n"
        "  torchmem snapshot info FILE  print its peak, what was live then by line, and "
        "its segments\n"
        "  torchmem snapshot diff A B   compare two snapshots' peaks, line by line\n"
        "`torchmem snapshot info --help` and `torchmem snapshot diff --help` give their "
        "options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
    p.add_argument("--top", type=positive_int, default=10, help="owners to list (10)")
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
    p.add_argument("--top", type=positive_int, default=15, help="lines to list (15)")
    return p


def lab_parser() -> argparse.ArgumentParser:
    """Parser of ``torchmem lab``."""
    from torchmem.lab.ops import BUILTIN

    p = argparse.ArgumentParser(
        prog="torchmem lab",
        description="Measure what tensor operations cost: the new storage each result "
        "owns, the peak extra memory, allocations, whether it is a view, and the median "
        "time, across sizes (n x n inputs). Measured in a process of its own: each CPU row in "
        "a fresh child of it.",
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
    p.add_argument("--repeats", type=positive_int, default=5, help="timed repeats (5)")
    p.add_argument(
        "--grad", action="store_true",
        help="inputs require grad: also measure what autograd saves for backward",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--csv", metavar="FILE", help="write the rows as CSV here too")
    p.add_argument(
        "--in-process", action="store_true",
        help="measure in this process instead of the lab's own (faster; the "
        "allocator's cache from earlier rows may then hide allocations)",
    )  # fmt: skip
    return p


def command_parser() -> argparse.ArgumentParser:
    """Parser of ``torchmem run [OPTIONS] -- COMMAND`` (the options before ``--``)."""
    p = argparse.ArgumentParser(
        prog="torchmem run [OPTIONS] --",
        description="Run any COMMAND (torchrun, a shell script, python -m ...) with an agent in "
        "every Python process of it that imports torch; exit with its exit code.",
        epilog="Example: torchmem run -- torchrun --nproc_per_node=2 train.py",
    )
    add_outputs(p, "the job (every rank)")
    p.add_argument("--hz", type=rate, default=10.0, help="sampling rate of the agents")
    p.add_argument(
        "--max-steps",
        type=positive_int,
        metavar="N",
        help="each torch process exits cleanly (code 0) at the end of its N-th step",
    )
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
    add_hosts(p, "list the processes of this SSH host instead (repeat for several)")
    # What the viewer's ssh runs on a host: the agents' entries, tokens included, into the
    # SSH session's pipe. Not for people: hidden.
    p.add_argument("--ssh-entries", nargs="?", type=int, const=-1, help=argparse.SUPPRESS)
    return p


def add_hosts(parser: argparse.ArgumentParser, host_help: str) -> None:
    """The options that name other machines, reached through the system's ssh."""
    group = parser.add_argument_group(
        "other machines (through your ssh: keys, ~/.ssh/config, ProxyJump; no open port)"
    )
    group.add_argument("--host", action="append", metavar="[USER@]HOST", help=host_help)
    group.add_argument(
        "--hostfile", metavar="FILE", help="the hosts of an MPI-style hostfile (host slots=N)"
    )
    group.add_argument(
        "--slurm-job", metavar="JOBID", help="the nodes of this Slurm job (needs squeue here)"
    )
    group.add_argument(
        "--slurm",
        action="store_true",
        help="the nodes of the Slurm allocation this runs in (SLURM_JOB_NODELIST)",
    )
    group.add_argument(
        "--remote-command",
        metavar="CMD",
        help="how to run torchmem on the hosts (default: torchmem, then python3 -m "
        "torchmem), e.g. /path/to/venv/bin/torchmem",
    )


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
    add_outputs(p, "what was collected", quiet="no progress or closing lines")
    p.add_argument("--hz", type=rate, default=10.0, help="rate when watching from outside")
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
    add_record(p)
    add_hosts(
        p,
        "attach on this SSH host (see `torchmem ps --host`); repeat it, without a PID, for "
        "every rank of a multi-node job",
    )
    p.add_argument(
        "pid",
        type=int,
        nargs="?",
        help="the process id (see `torchmem ps`); with hosts and no PID, every agent on them",
    )
    return p

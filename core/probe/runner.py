"""Run a user's script in the current thread, as ``python script.py ARGS`` would.

The script runs through :mod:`runpy` as ``__main__`` with its own ``sys.argv`` and its
folder first on ``sys.path``. Its output is echoed to the terminal and also sent to the
Session as log records. However it ends (normally, ``sys.exit(n)``, an exception, out of
memory, a stop request), the runner reports one :class:`RunFinished` and restores the
interpreter state it changed.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import io
import os
import runpy
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, TextIO

from torchmem.events import Event, RunFinished, RunStarted, RunStatus, Stream
from torchmem.probe.allocator import allocator_settings
from torchmem.probe.log_batch import LogBatcher
from torchmem.probe.pipe_lines import PipeLines, whole_lines
from torchmem.probe.steps import ScriptStopped, StepLimitReached, StepTracker

EXIT_STOPPED = 130  # what a shell reports for a run ended by Ctrl+C

SIGNAL_HINT = (
    "The script calls signal.signal(), which Python allows only in the main thread, and the "
    "torchmem window runs scripts in a background thread. Turn on Run > Run in a separate "
    "process (or start `torchmem --isolated SCRIPT`), or run it headless: `torchmem run "
    "SCRIPT ARGS`."
)

WORKERS_HINT = (
    "A DataLoader worker process failed. Worker processes started from a background thread "
    "can fail with the 'spawn' or 'forkserver' start methods: turn on Run > Run in a separate "
    "process, or try `torchmem run SCRIPT`."
)


class ScriptError(Exception):
    """A script that cannot be run at all; the message says why and what to do."""


def validate_script(path: str | os.PathLike[str]) -> Path:
    """Check that ``path`` is a runnable Python script and return it resolved.

    Raises :class:`ScriptError` for a missing path, a folder without ``__main__.py``, a
    binary or non-UTF-8 file, or a syntax error (with its line).
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise ScriptError(f"No such script: {p}. Check the path (it is relative to {Path.cwd()}).")
    if p.is_dir():
        if (p / "__main__.py").is_file():
            return p.resolve()
        raise ScriptError(f"{p} is a folder, not a script. Give a .py file to run.")
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ScriptError(f"Cannot read {p}: {exc.strerror}.") from exc
    if b"\0" in raw[:8192]:
        raise ScriptError(f"{p} is not a Python script (it is a binary file). Give a .py file.")
    try:
        source = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ScriptError(f"{p} is not a Python script (not UTF-8 text).") from exc
    try:
        compile(source, str(p), "exec", dont_inherit=True)
    except SyntaxError as exc:
        where = f"line {exc.lineno}" if exc.lineno else "unknown line"
        text = (exc.text or "").rstrip()
        hint = "" if p.suffix == ".py" else " Is it a Python script at all?"
        detail = f"\n    {text}" if text else ""
        raise ScriptError(f"Syntax error in {p.name}, {where}: {exc.msg}.{hint}{detail}") from exc
    return p.resolve()


#: How long the end of a run waits for its forked children's last lines.
FORK_OUTPUT_DRAIN_S = 0.5


class _Tee(io.TextIOBase):
    """A text stream that logs each write; the log's batches echo it to the terminal.

    The echo is not written here, write by write: see :mod:`torchmem.probe.log_batch` for
    why a write per line costs a script in the window more than its own work.

    In a forked child (a DataLoader worker) the sink is never called: it takes locks (the
    Session's) that another thread of the parent may have held at the fork, and a child
    that waits for them hangs for good (seen about once in 250 forks). The child writes
    whole lines to a pipe of the run instead (:attr:`fork_fds`, no lock on the way), which
    the run reads into its log; without one, straight to the terminal.
    """

    #: Set in a child after ``os.fork()``; the child's writes skip the sink.
    forked = False
    #: The write ends of the running run's pipes for forked children, per stream.
    fork_fds: ClassVar[dict[Stream, int]] = {}

    def __init__(
        self, original: TextIO | None, stream: Stream, sink: Callable[[Stream, str], None]
    ) -> None:
        self._original = original
        self._stream = stream
        self._sink = sink
        self._pending = ""  # a forked child's text after its last newline

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if _Tee.forked:
            self._forked_write(text)
        elif text:
            self._sink(self._stream, text)
        return len(text)

    def _forked_write(self, text: str, end: bool = False) -> None:
        fd = _Tee.fork_fds.get(self._stream)
        if fd is None:
            if self._original is not None:
                with contextlib.suppress(OSError, ValueError):
                    self._original.write(text)
            return
        # Whole lines in one write each (atomic up to PIPE_BUF), so that two workers'
        # lines never mix; print() writes its newline apart from its text.
        lines, self._pending = whole_lines(self._pending + text, end)
        data = lines.encode("utf-8", "replace")
        with contextlib.suppress(OSError):
            while data:
                data = data[os.write(fd, data) :]

    def flush(self) -> None:
        # Not a send: the batch reaches the terminal within BATCH_S anyway, and a script
        # that prints with flush=True in a loop would pay the GIL's toll at every line.
        if _Tee.forked:
            self._forked_write("", end=True)
            if self._original is not None:
                with contextlib.suppress(OSError, ValueError):
                    self._original.flush()

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._original, "encoding", None) or "utf-8"

    def fileno(self) -> int:
        if self._original is None:
            raise io.UnsupportedOperation("fileno")
        return self._original.fileno()


def echo(terminal: TextIO | None, text: str) -> None:
    """Write ``text`` to ``terminal`` now; a closed or broken terminal is not the script's
    failure."""
    if terminal is not None:
        with contextlib.suppress(OSError, ValueError):
            terminal.write(text)
            terminal.flush()


def _mark_forked() -> None:
    _Tee.forked = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_mark_forked)


def is_oom(exc: BaseException) -> bool:
    """True for an out-of-memory error of any backend: by type first (``MemoryError``,
    ``torch.OutOfMemoryError``), then by the message of a ``RuntimeError``."""
    if isinstance(exc, MemoryError):
        return True
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(exc, getattr(torch, "OutOfMemoryError", ())):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and (
        "out of memory" in text or "can't allocate memory" in text
    )


def _script_traceback(exc: BaseException, script: str) -> str:
    """The traceback from the script's first frame on (runpy and torchmem frames cut)."""
    tb = exc.__traceback__
    frames = traceback.extract_tb(tb)
    start = next((i for i, f in enumerate(frames) if f.filename == script), 0)
    while tb is not None and start > 0:
        tb, start = tb.tb_next, start - 1
    return "".join(traceback.format_exception(type(exc), exc, tb))


def classify_exception(exc: BaseException) -> tuple[RunStatus, int, str]:
    """How an exception that ended a script reads: out of memory (any backend), a
    signal handler outside the main thread, a failed DataLoader worker, or a plain error.
    The one classifier for runs in the window, ``torchmem run`` and served processes."""
    name = type(exc).__name__
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if is_oom(exc):
        return (
            RunStatus.OOM,
            1,
            (
                f"out of memory ({name}: {first[:200]}). Try a smaller batch size, activation "
                "checkpointing, or mixed precision; on CUDA, "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True reduces fragmentation."
            ),
        )
    if isinstance(exc, ValueError) and "signal only works in main thread" in str(exc):
        return RunStatus.FAILED, 1, SIGNAL_HINT
    if "DataLoader worker" in str(exc):
        return RunStatus.FAILED, 1, f"{name}: {first}. {WORKERS_HINT}"
    return RunStatus.FAILED, 1, f"raised {name}: {first}" if first else f"raised {name}"


class ScriptRunner:
    """Runs one script in the calling thread and reports events to ``emit``."""

    def __init__(
        self,
        script: str | os.PathLike[str],
        args: list[str] | tuple[str, ...] = (),
        emit: Callable[[Event], None] = lambda e: None,
        now: Callable[[], float] = time.monotonic,
        cwd: str | os.PathLike[str] | None = None,
        capture_output: bool = True,
        on_oom: Callable[[BaseException], None] | None = None,
        echo: bool = True,
    ) -> None:
        self.script = str(script)
        #: Captured output also goes to the terminal (see :attr:`Script.echo`).
        self.echo_output = echo
        #: Called in the script's thread with an out-of-memory error, while its traceback
        #: (and every tensor its frames hold) is still alive: the OOM census.
        self.on_oom = on_oom
        self.args = list(args)
        #: The script's output, coalesced; every other event flushes it first (in order).
        self._output = LogBatcher(emit, now, self._echo)
        #: Where each captured stream's batches are echoed (the streams the run replaced).
        self._terminals: dict[Stream, TextIO | None] = {}
        self.emit = self._in_order(emit)
        self.now = now
        self.cwd = cwd
        self.capture_output = capture_output
        self.tracker = StepTracker(self.emit, now)
        self._thread_ident: int | None = None
        self._done = threading.Event()
        self._fallback: threading.Timer | None = None

    @property
    def steps(self) -> int:
        """Steps seen so far."""
        return self.tracker.steps

    @property
    def thread_ident(self) -> int | None:
        """The thread the script runs in (``None`` before it starts)."""
        return self._thread_ident

    def _in_order(self, emit: Callable[[Event], None]) -> Callable[[Event], None]:
        def ordered(event: Event) -> None:
            self._output.flush()
            emit(event)

        return ordered

    def _log(self, stream: Stream, text: str) -> None:
        self._output.write(stream, text)

    def _echo(self, stream: Stream, text: str) -> None:
        echo(self._terminals.get(stream), text)

    def run(self) -> RunFinished:
        """Run the script to its end; never raises for anything the script does."""
        started = time.monotonic()
        self._thread_ident = threading.get_ident()
        self._done.clear()
        self._output.reopen()
        try:
            path = validate_script(self.script)
        except ScriptError as exc:
            return self._finish(RunStatus.FAILED, 2, str(exc), "", started)
        script_path = str(path / "__main__.py") if path.is_dir() else str(path)
        self.emit(
            RunStarted(self.now(), str(path), tuple(self.args), allocator=allocator_settings())
        )

        saved_argv, saved_path = sys.argv, list(sys.path)
        saved_out, saved_err = sys.stdout, sys.stderr
        saved_cwd = os.getcwd()
        sys.argv = [str(path), *self.args]
        sys.path.insert(0, str(path if path.is_dir() else path.parent))
        forked_output: list[PipeLines] = []
        if self.capture_output:
            if self.echo_output:
                self._terminals = {Stream.STDOUT: saved_out, Stream.STDERR: saved_err}
            sys.stdout = _Tee(saved_out, Stream.STDOUT, self._log)
            sys.stderr = _Tee(saved_err, Stream.STDERR, self._log)
            forked_output = self._open_fork_pipes()
        self.tracker.install(self._thread_ident)
        status, code, message, tb_text = RunStatus.FINISHED, 0, "", ""
        try:
            if self.cwd:
                os.chdir(self.cwd)
            runpy.run_path(str(path), run_name="__main__")
            message = "finished"
        except StepLimitReached:
            message = f"stopped after {self.tracker.steps} steps (--max-steps)"
        except SystemExit as exc:
            code, message = self._exit_code(exc)
            status = RunStatus.FINISHED if code == 0 else RunStatus.FAILED
        except (ScriptStopped, KeyboardInterrupt):
            status, code = RunStatus.STOPPED, EXIT_STOPPED
            message = f"stopped by the user at step {self.tracker.steps}"
        except BaseException as exc:
            tb_text = _script_traceback(exc, script_path)
            status, code, message = classify_exception(exc)
            if status is RunStatus.OOM and self.on_oom is not None:
                try:
                    self.on_oom(exc)
                except Exception as hook_error:  # the run's end is reported whatever happens
                    self._log(Stream.TORCHMEM, f"out-of-memory census failed: {hook_error}")
        finally:
            if self._fallback is not None:
                self._fallback.cancel()
            self._done.set()
            self.tracker.uninstall()
            self._close_fork_pipes(forked_output)
            self._output.close()
            sys.argv, sys.stdout, sys.stderr = saved_argv, saved_out, saved_err
            sys.path[:] = saved_path
            if os.getcwd() != saved_cwd:
                os.chdir(saved_cwd)
        return self._finish(status, code, message, tb_text, started)

    def _open_fork_pipes(self) -> list[PipeLines]:
        """A pipe per stream for the run's forked children (DataLoader workers): what they
        print reaches the run's log in whole lines, and the terminal with its batches."""
        readers = []
        for stream in (Stream.STDOUT, Stream.STDERR):
            try:
                read_fd, write_fd = os.pipe()  # close-on-exec: only forks inherit it
            except OSError:  # out of descriptors: the workers write to the terminal
                break
            _Tee.fork_fds[stream] = write_fd
            readers.append(
                PipeLines(read_fd, functools.partial(self._log, stream), "torchmem-fork-output")
            )
        return readers

    def _close_fork_pipes(self, readers: list[PipeLines]) -> None:
        """Close this process's write ends; what workers still running print goes on
        arriving until they exit. Their last lines are waited for a moment."""
        # Forgotten before closed: a fork meanwhile must never inherit a closed number
        # that this process may reuse for something else.
        fds = list(_Tee.fork_fds.values())
        _Tee.fork_fds.clear()
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        for reader in readers:
            reader.join(FORK_OUTPUT_DRAIN_S)

    def _finish(
        self, status: RunStatus, code: int, message: str, tb_text: str, started: float
    ) -> RunFinished:
        self._done.set()
        event = RunFinished(self.now(), status, code, message, tb_text, time.monotonic() - started)
        self.emit(event)
        return event

    @staticmethod
    def _exit_code(exc: SystemExit) -> tuple[int, str]:
        if exc.code is None:
            return 0, "exited with sys.exit()"
        if isinstance(exc.code, int):
            return exc.code, f"exited with sys.exit({exc.code})"
        return 1, f"exited: {exc.code}"

    # -- stopping --------------------------------------------------------------------------
    def request_stop(self, grace_s: float = 2.0) -> None:
        """Stop the script cooperatively; after ``grace_s`` force it (async exception).

        The cooperative stop lands at the next step, backward, mark or module forward.
        Scripts that do none of these get :class:`ScriptStopped` raised asynchronously in
        their thread, which Python delivers between bytecodes (not inside a blocking C call).
        """
        if self._done.is_set() or self._thread_ident is None:
            return
        self.tracker.request_stop()
        if self._fallback is None:
            self._fallback = threading.Timer(grace_s, self._force_stop)
            self._fallback.daemon = True
            self._fallback.start()

    def _force_stop(self) -> None:
        if self._done.is_set() or self._thread_ident is None:
            return
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(self._thread_ident), ctypes.py_object(ScriptStopped)
        )

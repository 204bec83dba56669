"""Injecting the agent into a running Python process that has none (experimental).

On Python 3.14+ both sides, ``sys.remote_exec`` runs a script file in the target at its
next safe point. Before 3.14, gdb queues the same script as a *pending call*
(``Py_AddPendingCall(PyRun_SimpleString, ...)``): the interpreter runs it in the main
thread between two bytecodes, never at the arbitrary point where gdb stopped it. The
script is a 0600 file in the private runtime directory, removed once the agent is up.

It needs permission to trace the target. Where the kernel refuses (Yama's ptrace_scope,
a container's seccomp profile), the error says so and what to do, never to lower
ptrace_scope for the whole machine.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

from torchmem.transport.discovery import AgentEntry, find_agent, runtime_dir

INJECT_TIMEOUT_S = 30.0

PTRACE_HELP = (
    "Launch the script through `torchmem run --attachable` (or add torchmem.serve() to it) "
    "so that no tracing is needed; or give only this command the right to trace: "
    "`sudo setpriv --reuid=$(id -u) --regid=$(id -g) --init-groups --inh-caps=+sys_ptrace "
    "--ambient-caps=+sys_ptrace torchmem attach --inject PID`."
)


class InjectError(Exception):
    """The agent could not be injected; the message says why and what to do."""


def _package_dir() -> Path:
    """The folder of the ``torchmem`` package (this module lives in its transport/)."""
    return Path(__file__).resolve().parent.parent


def _script(directory: Path) -> str:
    """The code the target runs: load this torchmem (wherever it is installed) and serve."""
    pkg = _package_dir()
    return (
        "def _torchmem_inject():\n"
        "    import importlib.util, os, sys, traceback\n"
        f"    os.environ['TORCHMEM_RUNTIME_DIR'] = {str(directory)!r}\n"
        "    try:\n"
        "        if 'torchmem' not in sys.modules:\n"
        "            spec = importlib.util.spec_from_file_location(\n"
        f"                'torchmem', {str(pkg / '__init__.py')!r},\n"
        f"                submodule_search_locations=[{str(pkg)!r}])\n"
        "            module = importlib.util.module_from_spec(spec)\n"
        "            sys.modules['torchmem'] = module\n"
        "            spec.loader.exec_module(module)\n"
        "        import torchmem\n"
        "        torchmem.serve()\n"
        "    except BaseException:\n"
        f"        with open({str(directory / 'inject-{}.err')!r}.format(os.getpid()), 'w') as f:\n"
        "            f.write(traceback.format_exc())\n"
        "_torchmem_inject()\n"
        "del _torchmem_inject\n"
    )


def _target_python(pid: int) -> tuple[int, int] | None:
    """The target's Python version from its memory map (libpython3.X) or executable."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        maps = ""
    found = re.search(r"libpython(\d)\.(\d+)", maps)
    if found is None:
        with contextlib.suppress(psutil.Error):
            found = re.search(r"python(\d)\.(\d+)", psutil.Process(pid).exe())
    return (int(found.group(1)), int(found.group(2))) if found else None


def ptrace_scope() -> int | None:
    """Yama's kernel.yama.ptrace_scope (0-3), or None where Yama is absent."""
    try:
        return int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text())
    except (OSError, ValueError):
        return None


def inject_agent(pid: int, timeout: float = INJECT_TIMEOUT_S) -> AgentEntry:
    """Start the agent inside process ``pid`` and return its entry; raises InjectError."""
    existing = find_agent(pid)
    if existing is not None:
        return existing
    try:
        proc = psutil.Process(pid)
        if proc.uids().real != os.getuid():
            raise InjectError(f"process {pid} belongs to another user")
    except psutil.NoSuchProcess:
        raise InjectError(f"no process with pid {pid}") from None
    version = _target_python(pid)
    if version is None:
        raise InjectError(f"process {pid} is not a Python process (no python in its map)")
    directory = runtime_dir()
    script = directory / f"inject-{pid}.py"
    error_file = directory / f"inject-{pid}.err"
    with contextlib.suppress(FileNotFoundError):
        error_file.unlink()
    fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(_script(directory))
    try:
        remote_exec = getattr(sys, "remote_exec", None)
        if remote_exec is not None and version >= (3, 14):
            try:
                remote_exec(pid, str(script))
            except (OSError, RuntimeError) as exc:
                raise InjectError(f"sys.remote_exec failed: {exc}. {PTRACE_HELP}") from None
        else:
            _gdb_pending_call(pid, script)
        return _wait_for_agent(pid, timeout, error_file)
    finally:
        with contextlib.suppress(FileNotFoundError):
            script.unlink()


def _gdb_pending_command(gdb: str, pid: int, code: str) -> list[str]:
    """gdb's command line that queues ``code`` as a pending call in ``pid``: the
    interpreter runs it in its main thread at a safe point."""
    literal = code.replace("\\", "\\\\").replace('"', '\\"')
    return [
        gdb, "-p", str(pid), "--batch", "--nx", "-q",
        "-ex", "set confirm off",
        "-ex", "set print thread-events off",
        "-ex", f'call (int) Py_AddPendingCall((int (*)(void *)) PyRun_SimpleString, '
               f'(void *) "{literal}")',
        "-ex", "detach",
    ]  # fmt: skip


def gdb_unsafe_here() -> str:
    """Why gdb cannot inject on this machine ("" when it can, or cannot tell): one
    pending call into a throwaway Python process, which must live on. A VM whose kernel
    refuses gdb the extended CPU state kills the target."""
    gdb = shutil.which("gdb")
    if gdb is None:
        return "gdb is not installed"
    target = subprocess.Popen(
        [sys.executable, "-u", "-c", "import time\nwhile True: time.sleep(0.01)"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        time.sleep(0.5)
        done = subprocess.run(
            _gdb_pending_command(gdb, target.pid, "pass"),
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        output = done.stdout + done.stderr
        if "Couldn't write extended state status" in output:
            return "gdb cannot restore a process's registers on this machine (a VM)"
        if "ptrace: Operation not permitted" in output or "Could not attach" in output:
            return "ptrace is refused here"
        time.sleep(0.5)
        if target.poll() is not None:
            return "the target died after gdb's call"
        return ""
    except subprocess.TimeoutExpired:
        return "gdb did not finish within 60 s"
    finally:
        if target.poll() is None:
            target.kill()
        target.wait()


def _gdb_pending_call(pid: int, script: Path) -> None:
    gdb = shutil.which("gdb")
    if gdb is None:
        raise InjectError(
            "injecting into Python < 3.14 needs gdb (apt-get install gdb). " + PTRACE_HELP
        )
    code = f"exec(open({str(script)!r}).read())"
    try:
        done = subprocess.run(
            _gdb_pending_command(gdb, pid, code), capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        raise InjectError(f"gdb did not finish attaching to {pid} within 60 s") from None
    output = done.stdout + done.stderr
    if "ptrace: Operation not permitted" in output or "Could not attach" in output:
        scope = ptrace_scope()
        why = f"the kernel does not let this process trace {pid} " + (
            f"(kernel.yama.ptrace_scope = {scope})" if scope else "(a container or LSM rule)"
        )
        raise InjectError(f"{why}. {PTRACE_HELP}")
    if "Couldn't write extended state status" in output:
        # Seen in a Firecracker VM: gdb could not put back the registers its call
        # borrowed, and the target's interrupted sleep then failed (errno 514).
        raise InjectError(
            f"gdb could not restore the registers of {pid} after its call (this machine's "
            "kernel refuses to write the extended CPU state: a virtual machine), so "
            "injecting is not safe here and the process may have been disturbed. "
            + PTRACE_HELP.split("; or ")[0]
        )
    if "No symbol" in output or "$1 = -1" in output:
        raise InjectError(
            f"gdb could not queue the call in {pid} ({output.strip().splitlines()[-1]}); "
            "is it a CPython process?"
        )
    if done.returncode != 0 and "$1 = 0" not in output:
        raise InjectError(f"gdb failed: {output.strip()[-500:]}")


def _wait_for_agent(pid: int, timeout: float, error_file: Path) -> AgentEntry:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        entry = find_agent(pid)
        if entry is not None:
            return entry
        if error_file.exists():
            text = error_file.read_text().strip().splitlines()
            error_file.unlink()
            raise InjectError(f"the agent failed to start in {pid}: {text[-1] if text else ''}")
        if not psutil.pid_exists(pid):
            raise InjectError(f"process {pid} exited before its agent started")
        time.sleep(0.05)
    raise InjectError(
        f"process {pid} never reached a safe point within {timeout:g} s: Python runs the "
        "injected call between two bytecodes of its main thread, and that thread is blocked "
        "(in a C call such as time.sleep, I/O or a long kernel). Try again when it runs "
        "Python code, or launch it through `torchmem run --attachable`."
    )

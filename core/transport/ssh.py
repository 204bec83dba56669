"""Agents on other machines, reached through the user's own ``ssh``: never a TCP port.

Training that outgrows one machine runs on servers without a display. Rather than have
agents listen on the network, torchmem asks the host over SSH which agents run there
(``torchmem ps --ssh-entries`` on the host prints their entries, tokens included, into the
SSH session's pipe: never into an argv, a log or a local file), then one ``ssh -N -L``
per host forwards each agent's Unix socket to a private local socket (0600, in a 0700
directory). The agent protocol then runs unchanged over those sockets.

The system client is used on purpose: it brings the user's keys, agent, ``~/.ssh/config``
aliases, ProxyJump and ControlMaster. It never prompts: ``BatchMode=yes`` turns a
password or passphrase prompt into an error that says which key is needed, and unknown
host keys are accepted on first use (``accept-new``), refused when they change.
``TORCHMEM_SSH_CONFIG`` names an ssh_config file to use instead of ``~/.ssh/config``
(OpenSSH reads the home directory from the password database, not ``$HOME``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from torchmem.probe.parent_watch import pdeathsig_preexec
from torchmem.transport.client import AttachError
from torchmem.transport.discovery import AgentEntry, host_name, runtime_dir
from torchmem.transport.protocol import PROTOCOL_VERSION

#: What runs torchmem on a host when the user names nothing: the entry point, then the
#: module of whatever ``python3`` the login shell finds.
DEFAULT_COMMANDS = ("torchmem", "python3 -m torchmem")
CONFIG_ENV = "TORCHMEM_SSH_CONFIG"
CONNECT_TIMEOUT_S = 10
#: The exit status of a remote shell that found no such command.
NOT_FOUND = 127


class SshError(AttachError):
    """SSH to a host failed, or the host's torchmem cannot serve us; the message says
    what to do."""


@dataclass
class SshHost:
    """A host as the user names it (``node1``, ``user@node1``, an alias of ssh_config),
    and the command that runs torchmem there (None: try :data:`DEFAULT_COMMANDS`)."""

    target: str
    remote_command: str | None = None
    #: The command that worked, once one has.
    resolved: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        check_target(self.target)

    @property
    def name(self) -> str:
        """The host without its user, for labels: ``node1``."""
        return host_name(self.target)


def check_target(target: str) -> None:
    """Refuse a host name that ssh would read as an option or that a shell would split."""
    if not target or target.startswith("-") or not re.fullmatch(r"[\w.@:%+\[\]-]+", target):
        raise SshError(f"{target!r} is not a host name (user@host or an ssh_config alias)")


def ssh_base(target: str) -> list[str]:
    """The ssh command line up to the host: never a prompt, and the user's own config."""
    ssh = shutil.which("ssh")
    if ssh is None:
        raise SshError("no ssh client found: install OpenSSH (openssh-client) on this machine")
    args = [
        ssh,
        "-o", "BatchMode=yes",
        "-o", "StrictHostKeyChecking=accept-new",
        "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
        "-o", "ServerAliveInterval=5",
        "-o", "ServerAliveCountMax=3",
    ]  # fmt: skip
    config = os.environ.get(CONFIG_ENV)
    if config:
        args += ["-F", config]
    return [*args, "--", target]


def explain_ssh_failure(target: str, stderr: str) -> str:
    """What a failed ssh (exit 255) means for the user, from its last words."""
    text = stderr.strip()
    last = text.splitlines()[-1] if text else "ssh exited without a message"
    if "Permission denied" in text:
        return (
            f"{target} refused our key ({last}). torchmem never asks for a password: load "
            f"your key into ssh-agent, or install one with `ssh-copy-id {target}`"
        )
    if "Host key verification failed" in text or "REMOTE HOST IDENTIFICATION" in text:
        return (
            f"{target}'s host key has changed since you last connected: check it, then "
            f"remove the old one with `ssh-keygen -R {target}`"
        )
    if "Could not resolve hostname" in text:
        return f"unknown host {target!r}: check the name, or add it to ~/.ssh/config"
    if "Connection refused" in text:
        return f"{target} refused the SSH connection: is sshd running there, on this port?"
    if "timed out" in text:
        return f"cannot reach {target}: the SSH connection timed out ({last})"
    return f"ssh to {target} failed: {last}"


def run_remote(
    host: SshHost, args: list[str], timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    """Run ``torchmem ARGS`` on ``host`` and return what it printed.

    Tries the host's command (remembering the one that worked); raises :class:`SshError`
    when ssh fails, when no torchmem is found there, or on a timeout.
    """
    chosen = host.resolved or host.remote_command
    commands = [chosen] if chosen else list(DEFAULT_COMMANDS)
    missing = []
    for command in commands:
        line = f"{command} {shlex.join(args)}"
        try:
            done = subprocess.run(
                [*ssh_base(host.target), line],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                start_new_session=True,  # a Ctrl+C of ours must not kill it half-way
            )
        except subprocess.TimeoutExpired:
            raise SshError(f"{host.target} did not answer within {timeout:g} s") from None
        if done.returncode == 255 and not done.stdout:
            raise SshError(explain_ssh_failure(host.target, done.stderr))
        if _not_installed(done):
            missing.append(command)
            continue
        host.resolved = command
        return done
    tried = " and ".join(f"`{c}`" for c in missing)
    raise SshError(
        f"torchmem is not installed on {host.target} (tried {tried}): run `pip install "
        "torchmem` there, in the environment that runs the training, or name its command "
        "with --remote-command (e.g. /path/to/venv/bin/torchmem)"
    )


def _not_installed(done: subprocess.CompletedProcess[str]) -> bool:
    err = done.stderr
    return done.returncode == NOT_FOUND or (
        done.returncode == 1 and "No module named torchmem" in err
    )


def _json_from(host: SshHost, done: subprocess.CompletedProcess[str], what: str) -> Any:
    if done.returncode == 2 and "unrecognized arguments" in done.stderr:
        raise SshError(
            f"the torchmem on {host.target} is too old to {what}: install the same torchmem "
            "version there as here"
        )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise SshError(f"`torchmem` on {host.target} failed (exit {done.returncode}): {last}")
    try:
        return json.loads(done.stdout)
    except ValueError:
        raise SshError(
            f"{host.target} answered something that is not torchmem's JSON (a login banner "
            "printed by the shell's startup files?)"
        ) from None


def remote_processes(host: SshHost, agents_only: bool = False) -> list[dict[str, Any]]:
    """The rows of ``torchmem ps --json`` on ``host`` (no tokens)."""
    args = ["ps", "--json"] + (["--agents"] if agents_only else [])
    rows = _json_from(host, run_remote(host, args), "list processes")
    if not isinstance(rows, list):
        raise SshError(f"{host.target} answered a malformed process list")
    return rows


def remote_entries(host: SshHost, pid: int | None = None) -> list[AgentEntry]:
    """The agents on ``host``, tokens included: of ``pid`` (or of its ranks, for a
    launcher), or every agent when ``pid`` is None. Checks the protocol version."""
    args = ["ps", "--ssh-entries"] + ([str(pid)] if pid is not None else [])
    data = _json_from(host, run_remote(host, args), "be attached to over SSH")
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise SshError(f"{host.target} answered a malformed list of agents")
    protocol = data.get("protocol")
    if protocol != PROTOCOL_VERSION:
        raise SshError(
            f"the torchmem on {host.target} ({data.get('torchmem', '?')}) speaks protocol "
            f"{protocol}, this one {PROTOCOL_VERSION}: install the same torchmem version on both"
        )
    entries = []
    for item in data["entries"]:
        try:
            entry = AgentEntry.from_json(item)
        except TypeError:
            continue
        entry.host = host.target
        entries.append(entry)
    return entries


class Tunnel:
    """One ``ssh -N`` that forwards the sockets of a host's agents to private local ones.

    :meth:`open` (or :meth:`start` then :meth:`wait`) returns the entries rewritten to
    their local ends; :meth:`close` ends the ssh process and removes the local sockets.
    The ssh process also dies with the thread that started it (``PR_SET_PDEATHSIG``), so
    a killed viewer leaves none behind: start it from the thread that follows the run.
    """

    def __init__(self, host: SshHost) -> None:
        self.host = host
        self.proc: subprocess.Popen[bytes] | None = None
        self.directory: Path | None = None
        self._stderr: Any = None
        self._pending: tuple[list[AgentEntry], list[Path]] = ([], [])

    def open(self, entries: list[AgentEntry], timeout: float = 20.0) -> list[AgentEntry]:
        """Forward every entry's address; raise :class:`SshError` if ssh cannot."""
        self.start(entries)
        return self.wait(timeout)

    def start(self, entries: list[AgentEntry]) -> None:
        """Start forwarding (without waiting: several hosts connect at once)."""
        base = runtime_dir()
        self.directory = Path(tempfile.mkdtemp(prefix="ssh-", dir=base))  # 0700
        forwards, local = [], []
        for i, entry in enumerate(entries):
            path = self.directory / f"{i}.sock"
            remote = entry.address
            if remote.startswith("tcp:"):  # an agent that listens on the host's TCP
                remote = remote[4:]
            forwards += ["-L", f"{path}:{remote}"]
            local.append(path)
        # What ssh says goes to a file, not a pipe that nobody reads while it runs.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close())
        base_args = ssh_base(self.host.target)
        args = [
            *base_args[:-2],
            "-N",
            "-o", "ExitOnForwardFailure=yes",
            "-o", "StreamLocalBindUnlink=yes",
            "-o", "StreamLocalBindMask=0177",
            *forwards,
            *base_args[-2:],
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
            preexec_fn=pdeathsig_preexec(signal.SIGTERM),
        )
        self._pending = (entries, local)

    def wait(self, timeout: float = 20.0) -> list[AgentEntry]:
        """Wait until every local socket is there; the entries rewritten to them."""
        entries, local = self._pending
        assert self.proc is not None, "start() first"
        deadline = time.monotonic() + timeout
        while not all(p.exists() for p in local):
            if self.proc.poll() is not None:
                message = explain_ssh_failure(self.host.target, self._read_stderr())
                self.close()
                raise SshError(message)
            if time.monotonic() > deadline:
                self.close()
                raise SshError(f"ssh to {self.host.target} did not forward within {timeout:g} s")
            time.sleep(0.02)
        return [
            replace(entry, address=str(path), host=self.host.target)
            for entry, path in zip(entries, local, strict=True)
        ]

    def _read_stderr(self) -> str:
        if self._stderr is None:
            return ""
        with contextlib.suppress(OSError, ValueError):
            self._stderr.seek(0)
            return self._stderr.read().decode(errors="replace")
        return ""

    def close(self) -> None:
        """End the ssh process and remove the local sockets."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

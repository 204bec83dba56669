"""A private sshd on localhost that stands in for a remote node in tests.

Each :class:`Node` runs its own ``sshd`` on a spare port with generated keys, and gives
sessions their own ``TORCHMEM_RUNTIME_DIR``: agents started "on the node" publish there,
and the viewer (the test process) knows the node only by its ssh_config alias.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def require_sshd() -> None:
    """Skip without sshd, unless CI requires it (then fail: the feature must be tested)."""
    if Path(SSHD).exists() and shutil.which("ssh") and shutil.which("ssh-keygen"):
        return
    message = "sshd, ssh and ssh-keygen are needed (apt-get install openssh-server)"
    if os.environ.get("TORCHMEM_REQUIRE_SSHD"):
        pytest.fail(message)
    pytest.skip(message)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
        check=True,
        capture_output=True,
    )


class Node:
    """One fake remote machine: an sshd, and the runtime directory its sessions use."""

    def __init__(self, root: Path, alias: str, client_key: Path) -> None:
        self.alias = alias
        self.dir = root / alias
        self.dir.mkdir(mode=0o700)
        # Short: agents' socket paths live in it (Unix socket paths are limited).
        self.runtime = Path(tempfile.mkdtemp(prefix="tm-node-"))
        self.runtime.chmod(0o700)
        host_key = self.dir / "host_key"
        _keygen(host_key)
        authorized = self.dir / "authorized_keys"
        authorized.write_text(Path(f"{client_key}.pub").read_text())
        authorized.chmod(0o600)
        self.port = _free_port()
        config = self.dir / "sshd_config"
        config.write_text(
            f"Port {self.port}\n"
            "ListenAddress 127.0.0.1\n"
            f"HostKey {host_key}\n"
            f"AuthorizedKeysFile {authorized}\n"
            f"PidFile {self.dir / 'sshd.pid'}\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "UsePAM no\n"
            "StrictModes no\n"
            "PermitRootLogin prohibit-password\n"
            "AllowTcpForwarding yes\n"
            "AllowStreamLocalForwarding yes\n"
            f"SetEnv TORCHMEM_RUNTIME_DIR={self.runtime}\n"
        )
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation
        self.log = (self.dir / "sshd.log").open("w")
        self.proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(config)], stdout=self.log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"sshd did not start: {(self.dir / 'sshd.log').read_text()}"
                    ) from None
                time.sleep(0.05)

    def env(self) -> dict[str, str]:
        """The environment of a process started "on this node"."""
        return {**os.environ, "TORCHMEM_RUNTIME_DIR": str(self.runtime)}

    def stop(self) -> None:
        """Stop sshd (sessions it forked end with their clients)."""
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.runtime, ignore_errors=True)


class Cluster:
    """Fake nodes and the ssh_config that names them, as a user's ~/.ssh/config would."""

    def __init__(self, root: Path, aliases: tuple[str, ...]) -> None:
        self.root = root
        self.key = root / "id_ed25519"
        _keygen(self.key)
        self.nodes = {alias: Node(root, alias, self.key) for alias in aliases}
        self.config = root / "ssh_config"
        user = getpass.getuser()
        text = ""
        for node in self.nodes.values():
            text += self._host(node.alias, node.port, self.key, user)
        # A host whose sshd refuses our key: a key it has never seen.
        stranger = root / "stranger_key"
        _keygen(stranger)
        first = next(iter(self.nodes.values()))
        text += self._host("refusing", first.port, stranger, user)
        text += self._host("nobody-listens", _free_port(), self.key, user)
        self.config.write_text(text)

    def _host(self, alias: str, port: int, key: Path, user: str) -> str:
        return (
            f"Host {alias}\n"
            "  HostName 127.0.0.1\n"
            f"  Port {port}\n"
            f"  User {user}\n"
            f"  IdentityFile {key}\n"
            "  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {self.root / 'known_hosts'}\n"
            "  LogLevel ERROR\n"
        )

    def stop(self) -> None:
        """Stop every node."""
        for node in self.nodes.values():
            node.stop()

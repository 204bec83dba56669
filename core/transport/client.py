"""The viewer's end of the agent protocol: connect, authenticate, request, receive events.

A reader thread decodes frames as they come: replies complete the request waiting for
them, event batches go to ``on_events``. Every failure (a refused handshake, a dead
agent, a malformed frame) becomes an :class:`AttachError` whose message says what
happened and what to do, and ``on_closed`` is told once when the connection ends.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchmem import __version__
from torchmem.transport.discovery import AgentEntry
from torchmem.transport.protocol import (
    MAX_REPLY_BYTES,
    PROTOCOL_VERSION,
    FrameReader,
    ProtocolError,
    encode,
)


class AttachError(Exception):
    """Attaching or talking to an agent failed; the message says why and what to do."""


def connect_socket(address: str, timeout: float) -> socket.socket:
    """A connected stream socket to an agent ``address`` (a socket path or ``tcp:H:P``)."""
    if address.startswith("tcp:"):
        host, _, port = address[4:].rpartition(":")
        return socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(address)
    except BaseException:
        sock.close()
        raise
    return sock


class AgentClient:
    """One connection to one agent."""

    def __init__(
        self,
        entry: AgentEntry,
        on_events: Callable[[list[dict[str, Any]], int], None] | None = None,
        on_closed: Callable[[str], None] | None = None,
        timeout: float = 5.0,
    ) -> None:
        self.entry = entry
        self.on_events = on_events or (lambda events, dropped: None)
        self.on_closed = on_closed or (lambda reason: None)
        self.timeout = timeout
        self.welcome: dict[str, Any] = {}
        self._sock: socket.socket | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[threading.Event, list[dict[str, Any]]]] = {}
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()
        self.close_reason = ""
        self.dropped = 0

    # -- connecting ----------------------------------------------------------------------------
    def connect(self) -> dict[str, Any]:
        """Connect and authenticate; returns the agent's welcome (its entry, its clock)."""
        pid = self.entry.pid
        try:
            sock = connect_socket(self.entry.address, self.timeout)
        except FileNotFoundError:
            raise AttachError(
                f"process {pid}'s agent socket is gone: the process has probably exited"
            ) from None
        except ConnectionRefusedError:
            raise AttachError(
                f"process {pid}'s agent refused the connection: it has exited or hung"
            ) from None
        except PermissionError:
            raise AttachError(
                f"no permission to open process {pid}'s agent socket: it belongs to another user"
            ) from None
        except OSError as exc:
            raise AttachError(f"cannot reach process {pid}'s agent: {exc}") from None
        reader = FrameReader(MAX_REPLY_BYTES)
        try:
            sock.sendall(
                encode(
                    {
                        "type": "hello",
                        "version": PROTOCOL_VERSION,
                        "token": self.entry.token,
                        "client": f"torchmem {__version__}",
                    }
                )
            )
            welcome = self._read_one(sock, reader)
        except (OSError, ProtocolError) as exc:
            sock.close()
            raise AttachError(
                f"process {pid}'s agent did not answer the handshake: {exc}"
            ) from None
        if welcome.get("type") == "error":
            sock.close()
            raise AttachError(f"process {pid}'s agent refused us: {welcome.get('message')}")
        if welcome.get("type") != "welcome" or welcome.get("version") != PROTOCOL_VERSION:
            sock.close()
            raise AttachError(f"process {pid}'s agent speaks another protocol version")
        sock.settimeout(None)
        self.welcome = welcome
        self._sock = sock
        self._thread = threading.Thread(
            target=self._read_loop, args=(sock, reader), name=f"torchmem-client-{pid}", daemon=True
        )
        self._thread.start()
        return welcome

    def _read_one(self, sock: socket.socket, reader: FrameReader) -> dict[str, Any]:
        while True:
            data = sock.recv(65536)
            if not data:
                raise ProtocolError("connection closed")
            for message in reader.feed(data):
                # A frame that came with the welcome is not lost: none can (the agent
                # sends nothing else before it is asked).
                return message

    # -- requests ----------------------------------------------------------------------------
    def request(self, name: str, args: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
        """Send a request and wait for its reply; returns the result or raises AttachError."""
        if self._sock is None or self._closed.is_set():
            raise AttachError(f"not connected: {self.close_reason or 'connection closed'}")
        rid = next(self._ids)
        done = threading.Event()
        box: list[dict[str, Any]] = []
        with self._lock:
            self._pending[rid] = (done, box)
        try:
            frame = encode({"type": "request", "id": rid, "name": name, "args": args or {}})
            with self._send_lock:
                self._sock.sendall(frame)
            if not done.wait(timeout):
                raise AttachError(f"the agent did not answer {name!r} within {timeout:g} s")
        except OSError as exc:
            raise AttachError(f"connection lost while sending {name!r}: {exc}") from None
        finally:
            with self._lock:
                self._pending.pop(rid, None)
        if not box:
            raise AttachError(
                f"connection closed before {name!r} was answered: {self.close_reason}"
            )
        reply = box[0]
        if not reply.get("ok"):
            raise AttachError(str(reply.get("error") or f"{name} failed"))
        return reply.get("result")

    # -- the reader thread ---------------------------------------------------------------------
    def _read_loop(self, sock: socket.socket, reader: FrameReader) -> None:
        reason = "the agent closed the connection (the process exited?)"
        try:
            while not self._closed.is_set():
                try:
                    data = sock.recv(1 << 20)
                except OSError as exc:
                    reason = f"connection lost: {exc}"
                    break
                if not data:
                    break
                for message in reader.feed(data):
                    self._dispatch(message)
        except ProtocolError as exc:
            reason = f"the agent sent a malformed frame ({exc})"
        except Exception as exc:  # a bug in a sink must not leave the connection half-dead
            reason = f"error handling the agent's data: {type(exc).__name__}: {exc}"
        if self._closed.is_set():
            reason = "closed"
        self._finish(reason)

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "reply":
            rid = message.get("id")
            with self._lock:
                waiter = self._pending.get(rid) if isinstance(rid, int) else None
            if waiter is not None:
                waiter[1].append(message)
                waiter[0].set()
        elif kind == "events":
            events = message.get("events")
            dropped = message.get("dropped", 0)
            if not isinstance(events, list) or not isinstance(dropped, int):
                raise ProtocolError("malformed events frame")
            self.dropped += dropped
            self.on_events(events, dropped)
        elif kind == "error" and message.get("fatal") is not False:
            raise ProtocolError(str(message.get("message")))

    def _finish(self, reason: str) -> None:
        with self._lock:
            if self.close_reason:
                return
            self.close_reason = reason
            waiters = list(self._pending.values())
        for done, _ in waiters:
            done.set()
        with contextlib.suppress(Exception):
            self.on_closed(reason)

    @property
    def connected(self) -> bool:
        """True until the connection ends."""
        return self._sock is not None and not self.close_reason

    def close(self) -> None:
        """Close the connection and wait for the reader thread."""
        self._closed.set()
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)
        self._thread = None
        if not self.close_reason:
            self._finish("closed")


def entry_from_file(path: str, address: str | None = None) -> AgentEntry:
    """An agent entry copied from another machine, reached at ``address`` (the local end
    of an SSH-forwarded socket). Raises AttachError with what is wrong."""
    try:
        data = json.loads(Path(path).read_text())
        entry = AgentEntry.from_json(data)
    except OSError as exc:
        raise AttachError(f"cannot read the agent entry {path}: {exc.strerror}") from None
    except (ValueError, TypeError):
        raise AttachError(f"{path} is not a torchmem agent entry (agent-PID.json)") from None
    if address:
        entry.address = address
    return entry

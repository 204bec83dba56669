"""The agent's side of a viewer's connection: who may connect, and what waits to be sent.

The agent (:mod:`torchmem.agent`) serves many viewers from one thread; each connection
keeps its own frame reader, its queue of outgoing frames, bounded so that a viewer that
stops reading costs bounded memory and never blocks training, and its handshake state.
The peer's uid is checked where the OS reports it.
"""

from __future__ import annotations

import itertools
import socket
import struct
import time
from collections import deque
from typing import Any

from torchmem.events import Event
from torchmem.transport.protocol import MAX_REQUEST_BYTES, FrameReader, encode
from torchmem.transport.wire import event_to_wire

#: Bytes queued for one viewer before its oldest event batches are dropped.
MAX_QUEUED_BYTES = 32 * 1024 * 1024


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a Unix socket, where the OS says it."""
    if sock.family != getattr(socket, "AF_UNIX", None):
        return None
    so_peercred = getattr(socket, "SO_PEERCRED", None)
    if so_peercred is not None:  # Linux: struct ucred {pid, uid, gid}
        creds = sock.getsockopt(socket.SOL_SOCKET, so_peercred, struct.calcsize("3i"))
        return struct.unpack("3i", creds)[1]
    return None


def peer_allowed(uid: int | None, own_uid: int) -> bool:
    """A peer may talk to the agent when it is the same user, or the OS cannot tell (the
    0600 socket and the token then keep others out)."""
    return uid is None or uid == own_uid


class ViewerLink:
    """One viewer's connection to the agent: its reader, its outgoing frames (bounded:
    a viewer that stops reading loses its oldest event batches, never a reply) and what
    it asked for."""

    ids = itertools.count(1)

    def __init__(self, sock: socket.socket) -> None:
        self.id = next(self.ids)
        self.sock = sock
        self.reader = FrameReader(MAX_REQUEST_BYTES)
        self.authed = False
        self.subscribed = False
        self.connected_at = time.monotonic()
        self.out: deque[tuple[bytes, bool]] = deque()  # (frame, droppable)
        self.out_bytes = 0
        self.sending: memoryview | None = None
        self.dropped = 0
        self.closing = False  # close once the queue is sent (after an error reply)

    def queue(self, frame: bytes, droppable: bool = False) -> None:
        """Send ``frame`` when the socket takes it; ``droppable`` event batches go first
        when the queue is over :data:`MAX_QUEUED_BYTES`."""
        self.out.append((frame, droppable))
        self.out_bytes += len(frame)
        while self.out_bytes > MAX_QUEUED_BYTES:
            # A slow viewer loses its oldest event batches, never replies.
            victim = next((i for i, (_, d) in enumerate(self.out) if d), None)
            if victim is None:
                break
            frame_out, _ = self.out[victim]
            del self.out[victim]
            self.out_bytes -= len(frame_out)
            self.dropped += 1


def reply_frame(rid: int, ok: bool, result: Any = None, error: str = "") -> bytes:
    """The frame that answers request ``rid``."""
    message: dict[str, Any] = {"type": "reply", "id": rid, "ok": ok}
    if ok:
        message["result"] = result
    else:
        message["error"] = error
    return encode(message)


def events_frame(events: list[Event], dropped: int) -> bytes:
    """One frame of events for subscribers, saying how many were ``dropped`` before."""
    return encode(
        {"type": "events", "events": [event_to_wire(e) for e in events], "dropped": dropped}
    )


def chunks(items: list[Any], size: int) -> list[list[Any]]:
    """``items`` in lists of at most ``size`` (a frame's worth)."""
    return [items[i : i + size] for i in range(0, len(items), size)]

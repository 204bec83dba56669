"""The agent: serves a process's memory to torchmem viewers over a private local socket.

It wraps an :class:`~torchmem.sources.inprocess.InProcessSource` (the same sampler, step hooks,
censuses, leak detector and commands a run in the window has) and forwards every event
of its Session to subscribed viewers. Training never waits for a viewer: the Session
listener only appends to a bounded queue; one daemon thread does all socket work, and a
second runs the requests that take time (a census, gc.collect) one at a time.

Security: a Unix socket (0600, in a 0700 directory), the peer's uid checked where the OS
reports it, and a random 256-bit token required in the first frame, compared in constant
time. Nothing received is executed: requests are names from a fixed table.
"""

from __future__ import annotations

import atexit
import contextlib
import hmac
import logging
import os
import queue
import secrets
import selectors
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchmem import __version__
from torchmem.events import Event, Marker, MarkerKind
from torchmem.probe.commands import COMMANDS
from torchmem.session import Session
from torchmem.sources.inprocess import InProcessSource
from torchmem.transport.discovery import (
    AgentEntry,
    boot_id,
    process_start_ticks,
    remove_entry,
    runtime_dir,
    write_entry,
)
from torchmem.transport.protocol import (
    PROTOCOL_VERSION,
    FrameError,
    ProtocolError,
    encode,
    field,
)
from torchmem.transport.replay import History
from torchmem.transport.viewers import (
    ViewerLink,
    chunks,
    events_frame,
    peer_allowed,
    peer_uid,
    reply_frame,
)

log = logging.getLogger(__name__)

#: Events waiting for the agent thread; a burst beyond this drops the oldest.
OUTBOX = 20_000
#: A viewer must say hello within this many seconds.
HELLO_TIMEOUT_S = 5.0
MAX_VIEWERS = 32

#: Requests answered in the agent thread at once; every command (probe.commands.COMMANDS)
#: runs in the command thread, one at a time.
INLINE_REQUESTS = ("subscribe", "unsubscribe", "info", "set_rate", "ping")


class Agent:
    """Serves ``source`` to viewers; :meth:`start` publishes it, :meth:`close` retracts it."""

    def __init__(
        self,
        source: InProcessSource,
        listen: str | None = None,
        directory: Path | None = None,
        label: str = "",
    ) -> None:
        self.source = source
        self.session: Session = source.session
        self.listen = listen
        self.directory = directory
        self.label = label
        self.token = secrets.token_hex(32)
        self.pid = os.getpid()
        self.entry: AgentEntry | None = None
        self._viewers: dict[int, ViewerLink] = {}
        self._subscribers = 0
        self._history = History()
        self._outbox: deque[Event] = deque(maxlen=OUTBOX)
        self._outbox_dropped = 0
        self._replies: deque[tuple[int, bytes]] = deque()
        self._requests: queue.Queue[tuple[int, int, str, dict[str, Any]]] = queue.Queue(16)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._worker: threading.Thread | None = None
        self._listener: socket.socket | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        self._unsubscribe: Callable[[], None] | None = None
        self.frames_in = 0
        self.errors = 0
        self._rank_known = False  # set at start; then once torch.distributed says it
        #: Set when the first viewer subscribes (``torchmem run --wait-attach``).
        self.first_viewer = threading.Event()

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> AgentEntry:
        """Open the socket, publish the discovery entry and start serving."""
        directory = self.directory or runtime_dir()
        self.directory = directory
        address = self._open_listener(directory)
        self.entry = AgentEntry(
            pid=self.pid,
            create_time=_create_time(),
            argv=list(sys.argv) if sys.argv and sys.argv[0] else [sys.executable],
            cwd=os.getcwd(),
            python=sys.version.split()[0],
            torch=_torch_version(),
            torchmem=__version__,
            protocol=PROTOCOL_VERSION,
            address=address,
            token=self.token,
            hz=self.source.sampler.hz,
            rank=_env_int("RANK"),
            local_rank=_env_int("LOCAL_RANK"),
            world_size=_env_int("WORLD_SIZE"),
            started=time.time() - self.session.now(),
            label=self.label,
            start_ticks=process_start_ticks(self.pid),
        )
        self._rank_known = self.entry.rank is not None
        self._unsubscribe = self.session.subscribe(self._on_event)
        self._thread = threading.Thread(target=self._serve, name="torchmem-agent", daemon=True)
        self._worker = threading.Thread(
            target=self._work, name="torchmem-agent-requests", daemon=True
        )
        self._thread.start()
        self._worker.start()
        write_entry(self.entry, directory)
        atexit.register(self.close)
        global _running
        _running = self
        return self.entry

    def _open_listener(self, directory: Path) -> str:
        if self.listen is None and hasattr(socket, "AF_UNIX"):
            path = directory / f"agent-{self.pid}.sock"
            if len(os.fsencode(path)) > 100:  # sun_path holds 104-108 bytes, per OS
                raise OSError(
                    f"the socket path {path} is too long for a Unix socket; set "
                    "TORCHMEM_RUNTIME_DIR to a shorter private directory"
                )
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            old = os.umask(0o177)  # the socket is born 0600: no window where others connect
            try:
                sock.bind(str(path))
            finally:
                os.umask(old)
            os.chmod(path, 0o600)
            address = str(path)
        else:
            host, _, port = (self.listen or "127.0.0.1:0").rpartition(":")
            host = host.strip("[]") or "127.0.0.1"
            if host not in ("127.0.0.1", "localhost", "::1"):
                sys.stderr.write(
                    f"torchmem: WARNING: the agent listens on {host}:{port}, reachable from "
                    "other machines; anyone with the token from this user's runtime "
                    "directory can read this process's memory statistics and run its "
                    "commands. Prefer forwarding the Unix socket over SSH (see the README).\n"
                )
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, int(port or 0)))
            bound = sock.getsockname()
            address = f"tcp:{bound[0]}:{bound[1]}"
        sock.listen(MAX_VIEWERS)
        sock.setblocking(False)
        self._listener = sock
        return address

    def close(self, linger_s: float = 0.5) -> None:
        """Stop serving: flush what viewers are owed (up to ``linger_s``), retract the entry."""
        global _running
        if self._thread is None or os.getpid() != self.pid:  # never from a forked child
            return
        if _running is self:
            _running = None
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
        if self._unsubscribe is not None:
            self._unsubscribe()
        deadline = time.monotonic() + linger_s
        while time.monotonic() < deadline and (self._outbox or self._owed()):
            self._wake()
            time.sleep(0.01)
        self._stop.set()
        self._wake()
        self._thread.join(2.0)
        with contextlib.suppress(queue.Full):
            self._requests.put_nowait((0, 0, "", {}))  # wakes the worker to see the stop
        if self._worker is not None:
            self._worker.join(2.0)
        self._thread = None
        if self.directory is not None:
            remove_entry(self.pid, self.directory)
        for sock in (self._wake_r, self._wake_w):
            sock.close()

    def _owed(self) -> bool:
        return any(v.out or v.sending for v in list(self._viewers.values()) if v.subscribed)

    @property
    def viewers(self) -> int:
        """Connected viewers that passed the handshake."""
        return sum(1 for v in list(self._viewers.values()) if v.authed)

    # -- the Session side (any thread, often the training loop: cheap and never blocking) --
    def _on_event(self, event: Event) -> None:
        self._history.keep(event)
        if self._subscribers:
            if len(self._outbox) == self._outbox.maxlen:
                self._outbox_dropped += 1
            self._outbox.append(event)
            if not isinstance(event, Marker):  # step markers ride along with the next sample
                self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a full pipe already means "wake up"
            self._wake_w.send(b"\0")

    # -- the agent thread ---------------------------------------------------------------------
    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        assert self._listener is not None
        sel.register(self._listener, selectors.EVENT_READ, "accept")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        try:
            while not self._stop.is_set():
                for key, mask in sel.select(timeout=0.2):  # samples wake it earlier
                    if key.data == "accept":
                        self._accept(sel)
                    elif key.data == "wake":
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                    else:
                        viewer = self._viewers.get(key.data)
                        if viewer is None:
                            continue
                        if mask & selectors.EVENT_READ:
                            self._read(sel, viewer)
                        if mask & selectors.EVENT_WRITE and viewer.id in self._viewers:
                            self._write(sel, viewer)
                self._pump(sel)
                if not self._rank_known:
                    self._learn_rank()
        except Exception:  # never take the training process down with the agent
            log.exception("torchmem agent stopped")
        finally:
            for viewer in list(self._viewers.values()):
                self._drop(sel, viewer)
            sel.close()
            if self._listener is not None:
                self._listener.close()

    def _learn_rank(self) -> None:
        """Publish this process's rank once torch.distributed knows it.

        torchrun's ranks find theirs in the environment before serving; an ``mp.spawn``
        rank gets its rank as an argument and passes it to ``init_process_group``, after
        the agent started with the import of torch. Its entry is rewritten then, so that
        the viewers that attach from then on (``torchmem run -- COMMAND`` waits a little
        for it) label it ``rank N``, not by its pid. Five cheap checks a second until then.
        """
        dist = sys.modules.get("torch.distributed")
        if dist is None or self.entry is None or self.directory is None:
            return
        try:
            if not (dist.is_available() and dist.is_initialized()):
                return
            rank, world_size = dist.get_rank(), dist.get_world_size()
        except Exception:  # a group being torn down or half made: look again later
            return
        self._rank_known = True
        if rank < 0:  # this process is not in the default group
            return
        self.entry.rank, self.entry.world_size = rank, world_size
        try:
            write_entry(self.entry, self.directory)
        except OSError as exc:
            log.warning("could not publish the rank of %s: %s", self.pid, exc)

    def _accept(self, sel: selectors.BaseSelector) -> None:
        assert self._listener is not None
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        if len(self._viewers) >= MAX_VIEWERS:
            sock.close()
            return
        try:
            uid = peer_uid(sock)
        except OSError:
            uid = -1
        if not peer_allowed(uid, os.getuid()):
            sock.close()
            return
        sock.setblocking(False)
        viewer = ViewerLink(sock)
        self._viewers[viewer.id] = viewer
        sel.register(sock, selectors.EVENT_READ, viewer.id)

    def _read(self, sel: selectors.BaseSelector, viewer: ViewerLink) -> None:
        try:
            data = viewer.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(sel, viewer)
            return
        if viewer.closing:  # refused: what it still sends is read and ignored
            return
        while True:
            try:
                for message in viewer.reader.feed(data):
                    data = b""
                    self.frames_in += 1
                    self._handle(viewer, message)
                    if viewer.closing:
                        return
                return
            except FrameError as exc:  # one bad frame; the stream is still in step
                data = b""
                self.errors += 1
                if not viewer.authed:
                    self._refuse(viewer, str(exc))
                    return
                viewer.queue(encode({"type": "error", "message": str(exc), "fatal": False}))
            except ProtocolError as exc:  # the stream itself is lost
                self.errors += 1
                self._refuse(viewer, str(exc))
                return

    def _refuse(self, viewer: ViewerLink, message: str) -> None:
        """Answer with an error, then close once it is sent."""
        viewer.queue(encode({"type": "error", "message": message, "fatal": True}))
        viewer.closing = True

    def _handle(self, viewer: ViewerLink, message: dict[str, Any]) -> None:
        kind = message["type"]
        if not viewer.authed:
            if kind != "hello":
                self._refuse(viewer, "the first frame must be a hello with the token")
                return
            version = message.get("version")
            token = message.get("token")
            if version != PROTOCOL_VERSION:
                self._refuse(
                    viewer,
                    f"protocol version {version!r} not supported (this agent speaks "
                    f"{PROTOCOL_VERSION}, torchmem {__version__}); use the same torchmem "
                    "version on both sides",
                )
                return
            if not isinstance(token, str) or not hmac.compare_digest(
                token.encode("utf-8", "replace"), self.token.encode()
            ):
                self._refuse(viewer, "wrong or missing token")
                return
            viewer.authed = True
            assert self.entry is not None
            viewer.queue(
                encode(
                    {
                        "type": "welcome",
                        "version": PROTOCOL_VERSION,
                        "agent": self.entry.public(),
                        "now": self.session.now(),
                        # Same boot, same CLOCK_MONOTONIC: the viewer maps times exactly.
                        "boot_id": boot_id(),
                        "t0": self.session.t0,
                    }
                )
            )
            return
        if kind != "request":
            raise FrameError(f"unexpected frame type {kind!r}")
        rid = message.get("id")
        if not isinstance(rid, int) or isinstance(rid, bool):
            raise FrameError("a request needs an integer 'id'")
        try:
            name = field(message, "name", str)
            args = field(message, "args", dict, {})
        except ProtocolError as exc:
            viewer.queue(reply_frame(rid, False, error=str(exc)))
            return
        if name in INLINE_REQUESTS:
            self._inline(viewer, rid, name, args)
        elif name in COMMANDS:
            try:
                self._requests.put_nowait((viewer.id, rid, name, args))
            except queue.Full:
                viewer.queue(reply_frame(rid, False, error="busy: too many requests in flight"))
        else:
            viewer.queue(reply_frame(rid, False, error=f"unknown request {name!r}"))

    def _inline(self, viewer: ViewerLink, rid: int, name: str, args: dict[str, Any]) -> None:
        if name == "subscribe":
            if not viewer.subscribed:
                viewer.subscribed = True
                self._subscribers += 1
                self.first_viewer.set()
                replay = self._history.replay(self.session)
                viewer.queue(reply_frame(rid, True, {"replayed": len(replay)}))
                for chunk in chunks(replay, 2000):
                    viewer.queue(events_frame(chunk, 0), droppable=False)
            else:
                viewer.queue(reply_frame(rid, True, {"replayed": 0}))
        elif name == "unsubscribe":
            if viewer.subscribed:
                viewer.subscribed = False
                self._subscribers -= 1
            viewer.queue(reply_frame(rid, True))
        elif name == "info":
            viewer.queue(reply_frame(rid, True, self.info()))
        elif name == "set_rate":
            hz = args.get("hz")
            if not isinstance(hz, (int, float)) or isinstance(hz, bool):
                viewer.queue(reply_frame(rid, False, error="set_rate needs a number 'hz'"))
                return
            self.source.sampler.set_rate(hz)
            viewer.queue(reply_frame(rid, True, {"hz": self.source.sampler.hz}))
        elif name == "ping":
            viewer.queue(reply_frame(rid, True, {"now": self.session.now()}))

    def info(self) -> dict[str, Any]:
        """What a viewer needs to set up its window: devices, capacity, rate, state."""
        source = self.source
        return {
            "capacity": source.capacity(),
            "has_accelerator": source.has_accelerator,
            "hz": source.sampler.hz,
            "steps": source.steps,
            "running": source.running,
            "now": self.session.now(),
            "viewers": self.viewers,
            "frames_in": self.frames_in,
            "protocol_errors": self.errors,
        }

    def _pump(self, sel: selectors.BaseSelector) -> None:
        """Batch pending events for subscribers, post replies, and close idle handshakes."""
        if self._outbox:
            batch = []
            while self._outbox:
                try:
                    batch.append(self._outbox.popleft())
                except IndexError:
                    break
            dropped, self._outbox_dropped = self._outbox_dropped, 0
            subscribers = [v for v in self._viewers.values() if v.subscribed and not v.closing]
            if subscribers:
                for chunk in chunks(batch, 2000):
                    frame = events_frame(chunk, dropped)
                    dropped = 0
                    for viewer in subscribers:
                        viewer.queue(frame, droppable=True)
        while self._replies:
            vid, frame = self._replies.popleft()
            viewer = self._viewers.get(vid)
            if viewer is not None:
                viewer.queue(frame)
        now = time.monotonic()
        for viewer in list(self._viewers.values()):
            late = now - viewer.connected_at > HELLO_TIMEOUT_S
            if not viewer.authed and not viewer.closing and late:
                self._refuse(viewer, "no hello within the time limit")
            if viewer.out or viewer.sending is not None:
                self._write(sel, viewer)

    def _write(self, sel: selectors.BaseSelector, viewer: ViewerLink) -> None:
        try:
            while True:
                if viewer.sending is None:
                    if not viewer.out:
                        break
                    frame, _ = viewer.out.popleft()
                    viewer.out_bytes -= len(frame)
                    viewer.sending = memoryview(frame)
                sent = viewer.sock.send(viewer.sending)
                viewer.sending = viewer.sending[sent:] if sent < len(viewer.sending) else None
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._drop(sel, viewer)
            return
        pending = viewer.sending is not None or bool(viewer.out)
        if not pending and viewer.closing:
            self._drop(sel, viewer)
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if pending else 0)
        with contextlib.suppress(KeyError, ValueError):
            sel.modify(viewer.sock, events, viewer.id)

    def _drop(self, sel: selectors.BaseSelector, viewer: ViewerLink) -> None:
        if self._viewers.pop(viewer.id, None) is None:
            return
        if viewer.subscribed:
            self._subscribers -= 1
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(viewer.sock)
        viewer.sock.close()

    # -- the request thread --------------------------------------------------------------------
    def _work(self) -> None:
        while not self._stop.is_set():
            try:
                vid, rid, name, args = self._requests.get(timeout=0.5)
            except queue.Empty:
                continue
            if not name:
                continue
            try:
                ok, result, error = True, self._run_request(name, args), ""
            except Exception as exc:
                ok, result, error = False, None, str(exc) or type(exc).__name__
            self._replies.append((vid, reply_frame(rid, ok, result, error)))
            self._wake()

    def _run_request(self, name: str, args: dict[str, Any]) -> Any:
        source = self.source
        if COMMANDS[name].measured:
            # The result reaches every viewer as an event, failed or not; an error reply
            # as well would tell the asking viewer twice.
            (result,) = source.command(name)
            return {"ok": result.ok, "message": result.message, "output": result.output}
        if name == "mark":
            label = args.get("label")
            if not isinstance(label, str) or not label.strip():
                raise ValueError("mark needs a non-empty 'label'")
            label = label[:200]
            kind = MarkerKind.of_label(label)
            source.emit(Marker(self.session.now(), kind, label, source.steps))
            return {"label": label}
        if name == "stop":
            if not source.running:
                raise RuntimeError("nothing to stop: the run has ended")
            source.request_stop()
            return {"message": "stop requested: the script stops at its next step"}
        if name == "referrers":
            return _referrers(args)
        raise ValueError(f"unknown request {name!r}")


# -- helpers ------------------------------------------------------------------------------------
def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def _create_time() -> float:
    import psutil

    return psutil.Process().create_time()


def _torch_version() -> str:
    torch = sys.modules.get("torch")
    return str(getattr(torch, "__version__", "")) if torch is not None else ""


def _referrers(args: dict[str, Any]) -> dict[str, Any]:
    """What keeps one tensor alive, found again from its census identity."""
    from torchmem.tensors.referrers import referrers_of, tensor_identity

    return referrers_of(tensor_identity(args))


_running: Agent | None = None  # the agent serving this process, however it was started


def running_agent() -> Agent | None:
    """The agent serving this process (``torchmem run --attachable``, ``serve()``), if any."""
    return _running

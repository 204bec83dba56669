"""The agent's wire format: versioned, length-prefixed msgpack frames with a size limit.

A frame is a 4-byte big-endian length followed by that many bytes of msgpack, which must
decode to a map with a string ``"type"``. Nothing in a frame is ever executed: msgpack
carries only plain data (no pickle, no extension types), and every field is checked
before use. A frame over the reader's limit, or one that does not decode to such a map,
raises :class:`ProtocolError`; the agent answers it with an error and closes the
connection, so a broken or hostile peer costs at most one frame of memory.

The conversation (viewer -> agent, agent -> viewer)::

    hello {version, token, client}      -> welcome {version, agent, now} | error
    request {id, name, args}            -> reply {id, ok, result | error}
    (after the "subscribe" request)     <- events {events: [...], dropped}
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import msgpack

#: Bumped on any incompatible change; a hello with another version is refused.
PROTOCOL_VERSION = 2  # 2: events carry their dataclass field names
#: Requests are small: anything larger from a viewer is refused unread.
MAX_REQUEST_BYTES = 64 * 1024
#: Replies may carry a census of 100k tensors; nothing legitimate comes close to this.
MAX_REPLY_BYTES = 256 * 1024 * 1024

_HEADER = struct.Struct("!I")
HEADER_BYTES = _HEADER.size


class ProtocolError(Exception):
    """A frame that breaks the protocol (too large, not msgpack, not a typed map)."""


class FrameError(ProtocolError):
    """One bad frame in a stream that is still in step: the frames after it can be read."""


def encode(message: dict[str, Any]) -> bytes:
    """One frame: the length prefix and the msgpack body of ``message``."""
    body = msgpack.packb(message, use_bin_type=True)
    return _HEADER.pack(len(body)) + body


def decode_body(body: bytes) -> dict[str, Any]:
    """Decode one frame body into a typed map, or raise :class:`ProtocolError`."""
    try:
        # strict_map_key: keys are str/bytes only; the default length limits are derived
        # from len(body), so a header that claims 4 billion items fails at once.
        message = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise FrameError(f"undecodable frame: {type(exc).__name__}") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise FrameError("a frame must be a map with a string 'type'")
    return message


class FrameReader:
    """Splits a byte stream into decoded frames, refusing any frame over ``max_bytes``.

    Memory stays bounded: at most one frame (plus one recv) is buffered, and the length
    is checked before the body is read.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._buf = bytearray()

    def feed(self, data: bytes) -> Iterator[dict[str, Any]]:
        """Add received bytes; yield every complete frame they finish.

        A :class:`FrameError` leaves the reader past the bad frame: ``feed(b"")`` goes on
        with the frames after it. Any other :class:`ProtocolError` means the stream is lost.
        """
        self._buf += data
        while len(self._buf) >= HEADER_BYTES:
            (size,) = _HEADER.unpack_from(self._buf)
            if size > self.max_bytes:
                raise ProtocolError(
                    f"frame of {size} bytes exceeds the limit of {self.max_bytes} bytes"
                )
            end = HEADER_BYTES + size
            if len(self._buf) < end:
                return
            body = bytes(self._buf[HEADER_BYTES:end])
            del self._buf[:end]
            yield decode_body(body)

    @property
    def pending(self) -> int:
        """Bytes received but not yet part of a whole frame."""
        return len(self._buf)


def field(
    message: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any = ...
) -> Any:
    """``message[name]`` checked against ``kind``; ProtocolError when missing or wrong."""
    if name not in message:
        if default is not ...:
            return default
        raise ProtocolError(f"missing field {name!r}")
    value = message[name]
    # bool is an int in Python; never accept one where a number is expected.
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _kinds(kind)):
        raise ProtocolError(f"field {name!r} has the wrong type")
    return value


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)

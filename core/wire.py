"""Events as plain msgpack-able data, and back, checked field by field.

The agent sends the very events the in-process source emits; the viewer turns them back
into the same dataclasses and submits them to its Session, so views never know whether a
run is local or attached. Decoding trusts nothing: a wrong type or a missing field is a
:class:`~torchmem.protocol.ProtocolError`, never an exception of another kind.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from .census_model import KINDS, Census, Skipped, StorageInfo, TensorInfo
from .events import (
    Alert,
    CensusTaken,
    CommandResult,
    Event,
    LogRecord,
    Marker,
    MarkerKind,
    RunFinished,
    RunStarted,
    RunStatus,
    Sample,
    Stream,
)
from .protocol import ProtocolError, field

_NUM = (int, float)
_TENSOR_FIELDS = [f.name for f in fields(TensorInfo)]


# -- census -------------------------------------------------------------------------------
def census_to_wire(census: Census) -> dict[str, Any]:
    """A census as nested lists (a tensor is a list of its fields in declaration order)."""
    storages = []
    for s in census.storages.values():
        tensors = [
            [
                t.name,
                t.kind,
                list(t.shape),
                list(t.stride),
                t.storage_offset,
                t.dtype,
                t.device,
                t.numel,
                t.element_size,
                t.span_bytes,
                t.is_view,
                t.is_contiguous,
                t.requires_grad,
                t.is_leaf,
                t.grad_fn,
                t.pinned,
                list(t.names),
                t.named,
            ]
            for t in s.tensors
        ]
        storages.append([s.key[0], s.key[1], s.nbytes, tensors])
    return {
        "storages": storages,
        "skipped": [[k.label, k.reason] for k in census.skipped],
        "duration_s": census.duration_s,
        "step": census.step,
    }


_TENSOR_TYPES: tuple[Any, ...] = (
    str, str, list, list, int, str, str, int, int, int,
    bool, bool, bool, bool, str, bool, list, bool,
)  # fmt: skip


def _ints(value: Any) -> tuple[int, ...]:
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ProtocolError("shape and stride must be lists of integers")
    return tuple(value)


def census_from_wire(data: Any) -> Census:
    """The inverse of :func:`census_to_wire`, checking every field."""
    if not isinstance(data, dict):
        raise ProtocolError("a census must be a map")
    storages: dict[tuple[str, int], StorageInfo] = {}
    for entry in field(data, "storages", list):
        if not (isinstance(entry, list) and len(entry) == 4):
            raise ProtocolError("a storage must be [device, data_ptr, nbytes, tensors]")
        device, ptr, nbytes, tensors = entry
        if not (isinstance(device, str) and isinstance(ptr, int) and isinstance(nbytes, int)):
            raise ProtocolError("malformed storage key or size")
        if not isinstance(tensors, list):
            raise ProtocolError("a storage's tensors must be a list")
        key = (device, ptr)
        storage = StorageInfo(key, nbytes)
        for t in tensors:
            if not (isinstance(t, list) and len(t) == len(_TENSOR_TYPES)):
                raise ProtocolError("malformed tensor entry")
            for value, kind in zip(t, _TENSOR_TYPES, strict=True):
                if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                    raise ProtocolError("malformed tensor field")
            if t[1] not in KINDS:
                raise ProtocolError(f"unknown tensor kind {t[1]!r}")
            if not all(isinstance(n, str) for n in t[16]):
                raise ProtocolError("tensor names must be strings")
            values = list(t[:16])
            values[2], values[3] = _ints(t[2]), _ints(t[3])
            storage.tensors.append(TensorInfo(*values, key, tuple(t[16]), t[17]))
        storages[key] = storage
    skipped = []
    for item in field(data, "skipped", list):
        if not (
            isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item)
        ):
            raise ProtocolError("malformed skipped entry")
        skipped.append(Skipped(item[0], item[1]))
    return Census(
        storages, skipped, float(field(data, "duration_s", _NUM)), field(data, "step", int)
    )


# -- events -------------------------------------------------------------------------------
def event_to_wire(event: Event) -> dict[str, Any]:
    """One event as a map with its kind under ``"e"``."""
    if isinstance(event, Sample):
        return {"e": "sample", "t": event.t, "v": event.values, "s": event.step}
    if isinstance(event, Marker):
        k = event.kind.value
        return {"e": "marker", "t": event.t, "k": k, "l": event.label, "s": event.step}
    if isinstance(event, LogRecord):
        return {"e": "log", "t": event.t, "stream": event.stream.value, "text": event.text}
    if isinstance(event, RunStarted):
        return {
            "e": "run_started",
            "t": event.t,
            "script": event.script,
            "argv": list(event.argv),
            "mode": event.mode,
        }
    if isinstance(event, RunFinished):
        return {
            "e": "run_finished",
            "t": event.t,
            "status": event.status.value,
            "exit_code": event.exit_code,
            "message": event.message,
            "traceback": event.traceback,
            "duration_s": event.duration_s,
        }
    if isinstance(event, CommandResult):
        return {
            "e": "command",
            "t": event.t,
            "command": event.command,
            "ok": event.ok,
            "message": event.message,
            "changes": event.changes,
            "output": event.output,
        }
    if isinstance(event, CensusTaken):
        return {
            "e": "census",
            "t": event.t,
            "step": event.step,
            "trigger": event.trigger,
            "census": census_to_wire(event.census),
        }
    if isinstance(event, Alert):
        data = {f.name: getattr(event, f.name) for f in fields(Alert)}
        data["culprits"] = list(event.culprits)
        data["e"] = "alert"
        return data
    raise TypeError(f"not an event: {type(event).__name__}")


def _values(data: Any) -> dict[str, float]:
    if not isinstance(data, dict):
        raise ProtocolError("sample values must be a map")
    for k, v in data.items():
        if not isinstance(k, str) or not isinstance(v, _NUM) or isinstance(v, bool):
            raise ProtocolError("sample values must map names to numbers")
    return data


def _enum(enum: type, value: Any) -> Any:
    try:
        return enum(value)
    except ValueError:
        raise ProtocolError(f"unknown {enum.__name__} {value!r}") from None


def _optional_int(data: dict[str, Any], name: str) -> int | None:
    value = data.get(name)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise ProtocolError(f"field {name!r} must be an integer or nil")
    return value


def _optional_str(data: dict[str, Any], key: str) -> str:
    """A text field newer agents send and older ones leave out."""
    value = data.get(key, "")
    if not isinstance(value, str):
        raise ProtocolError(f"field {key!r} must be a string")
    return value


def event_from_wire(data: Any) -> Event:
    """Rebuild the event :func:`event_to_wire` wrote; ProtocolError for anything else."""
    if not isinstance(data, dict):
        raise ProtocolError("an event must be a map")
    kind = field(data, "e", str)
    t = float(field(data, "t", _NUM))
    if kind == "sample":
        return Sample(t, _values(field(data, "v", dict)), _optional_int(data, "s"))
    if kind == "marker":
        return Marker(
            t,
            _enum(MarkerKind, field(data, "k", str)),
            field(data, "l", str),
            field(data, "s", int),
        )
    if kind == "log":
        return LogRecord(t, _enum(Stream, field(data, "stream", str)), field(data, "text", str))
    if kind == "run_started":
        argv = field(data, "argv", list)
        if not all(isinstance(a, str) for a in argv):
            raise ProtocolError("argv must be strings")
        return RunStarted(t, field(data, "script", str), tuple(argv), field(data, "mode", str))
    if kind == "run_finished":
        return RunFinished(
            t,
            _enum(RunStatus, field(data, "status", str)),
            field(data, "exit_code", int),
            field(data, "message", str),
            field(data, "traceback", str),
            float(field(data, "duration_s", _NUM)),
        )
    if kind == "command":
        return CommandResult(
            t,
            field(data, "command", str),
            field(data, "ok", bool),
            field(data, "message", str),
            _values(field(data, "changes", dict)),
            _optional_str(data, "output"),
        )
    if kind == "census":
        return CensusTaken(
            t,
            field(data, "step", int),
            census_from_wire(field(data, "census", dict)),
            field(data, "trigger", str),
        )
    if kind == "alert":
        culprits = field(data, "culprits", list)
        if not all(isinstance(c, dict) for c in culprits):
            raise ProtocolError("culprits must be maps")
        return Alert(
            t=t,
            key=field(data, "key", str),
            kind=field(data, "kind", str),
            severity=field(data, "severity", str),
            state=field(data, "state", str),
            series=field(data, "series", str),
            first_step=field(data, "first_step", int),
            step=field(data, "step", int),
            message=field(data, "message", str),
            suggestion=field(data, "suggestion", str),
            per_step=float(field(data, "per_step", _NUM)),
            per_minute=float(field(data, "per_minute", _NUM)),
            culprits=tuple(culprits),
            raised_step=field(data, "raised_step", int),
        )
    raise ProtocolError(f"unknown event kind {kind!r}")

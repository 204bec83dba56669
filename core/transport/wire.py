"""Events as plain msgpack-able data, and back, checked field by field.

The agent sends the very events the in-process source emits; the viewer turns them back
into the same dataclasses and submits them to its Session, so views never know whether a
run is local or attached. The encoding is derived from the dataclasses' fields and type
hints, so a field added to an event travels without another line here (give it a default,
and agents of the older shape still decode). Decoding trusts nothing: a wrong type or a
missing field is a :class:`~torchmem.transport.protocol.ProtocolError`, never an exception
of another kind.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, fields
from enum import Enum
from typing import Any

from torchmem.events import (
    Alert,
    CapacityKnown,
    CensusTaken,
    CommandResult,
    Event,
    JobMembers,
    LogRecord,
    Marker,
    RunFinished,
    RunStarted,
    Sample,
)
from torchmem.tensors.model import KINDS, Census, Skipped, StorageInfo, TensorInfo
from torchmem.transport.protocol import ProtocolError, field

#: The name of each event type on the wire (under ``"e"``).
EVENT_NAMES: dict[type, str] = {
    Sample: "sample",
    Marker: "marker",
    LogRecord: "log",
    RunStarted: "run_started",
    RunFinished: "run_finished",
    CommandResult: "command",
    CensusTaken: "census",
    Alert: "alert",
    CapacityKnown: "capacity",
    JobMembers: "job",
}
_EVENT_TYPES = {name: cls for cls, name in EVENT_NAMES.items()}

Encode = Callable[[Any], Any]
Decode = Callable[[Any, str], Any]


# -- one codec per annotated type ----------------------------------------------------------
def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError(f"field {name!r} must be a number")
    return float(value)


def _checked(kind: type) -> Decode:
    def decode(value: Any, name: str) -> Any:
        # bool is an int in Python; never accept one where a number is expected.
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise ProtocolError(f"field {name!r} must be of type {kind.__name__}")
        return value

    decode.fast = ("is", kind)  # type: ignore[attr-defined]  # see _Shape's compiled decoder
    return decode


def _enum(enum: type[Enum]) -> Decode:
    def decode(value: Any, name: str) -> Any:
        try:
            return enum(value)
        except ValueError:
            raise ProtocolError(f"unknown {enum.__name__} {value!r}") from None

    return decode


def _identity(value: Any) -> Any:
    return value


def _codec(hint: Any) -> tuple[Encode, Decode]:
    """How to write and check a value of the annotated type ``hint``."""
    if hint is Any:
        return _identity, lambda value, name: value
    if hint is float:
        return _identity, _number
    if hint in (int, str, bool):
        return _identity, _checked(hint)
    if isinstance(hint, type) and issubclass(hint, Enum):
        return (lambda value: hint(value).value), _enum(hint)  # a plain str is checked too
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        enc, dec = _codec(inner)
        return (
            lambda value: None if value is None else enc(value),
            lambda value, name: None if value is None else dec(value, name),
        )
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        enc, dec = _codec(args[0])

        def decode_tuple(value: Any, name: str) -> tuple[Any, ...]:
            if not isinstance(value, list):
                raise ProtocolError(f"field {name!r} must be a list")
            return tuple(dec(item, name) for item in value)

        inner = getattr(dec, "fast", None)
        if inner is not None and inner[0] == "is":
            decode_tuple.fast = ("tuple", inner[1])  # type: ignore[attr-defined]
        return (lambda value: [enc(item) for item in value]), decode_tuple
    if origin is dict and args[0] is str:
        _, dec = _codec(args[1])

        def decode_map(value: Any, name: str) -> dict[str, Any]:
            if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
                raise ProtocolError(f"field {name!r} must be a map with string keys")
            for item in value.values():
                dec(item, name)
            return value  # checked, not converted: samples are the hottest path

        return _identity, decode_map
    raise TypeError(f"no wire encoding for {hint!r}")


class _Shape:
    """The fields of one dataclass, each with its codec and default (derived once)."""

    def __init__(
        self, cls: type, skip: tuple[str, ...] = (), **special: tuple[Encode, Decode]
    ) -> None:
        hints = typing.get_type_hints(cls)
        self.cls = cls
        self.fields = []
        for f in fields(cls):
            if f.name in skip:
                continue
            enc, dec = special.get(f.name) or _codec(hints[f.name])
            has_default = f.default is not MISSING or f.default_factory is not MISSING
            self.fields.append((f.name, enc, dec, has_default))
        self._from_list = self._compile_from_list()

    def _compile_from_list(self) -> Callable[[Any], dict[str, Any]]:
        """A decoder of this shape's lists written out field by field, as dataclasses
        write their ``__init__``: a census replays up to 100k of them (a recorded session
        reopens with several). A value of exactly the expected type passes with one
        ``type() is`` test; anything else goes to the field's checking decoder, which
        converts it (an int where a float is expected) or raises ProtocolError."""
        names = [f"v{i}" for i in range(len(self.fields))]
        lines = [
            "def from_list(values):",
            "    if type(values) is not list or len(values) != N:",
            "        raise ProtocolError(MALFORMED)",
            f"    {', '.join(names)}{',' if len(names) == 1 else ''} = values",
        ]
        scope: dict[str, Any] = {
            "ProtocolError": ProtocolError,
            "N": len(self.fields),
            "MALFORMED": f"malformed {self.cls.__name__} entry",
        }
        for i, (name, _, dec, _) in enumerate(self.fields):
            v, fast = names[i], getattr(dec, "fast", None)
            scope[f"K{i}"], scope[f"D{i}"] = (fast[1] if fast else None), dec
            if fast is not None and fast[0] == "is":
                lines.append(f"    if type({v}) is not K{i}: {v} = D{i}({v}, {name!r})")
            elif fast is not None and fast[0] == "tuple":
                lines.append(
                    f"    {v} = tuple({v}) if type({v}) is list and "
                    f"all([type(x) is K{i} for x in {v}]) else D{i}({v}, {name!r})"
                )
            else:
                lines.append(f"    {v} = D{i}({v}, {name!r})")
        keys = [name for name, *_ in self.fields]
        pairs = ", ".join(f"{name!r}: {v}" for name, v in zip(keys, names, strict=True))
        lines.append(f"    return {{{pairs}}}")
        exec("\n".join(lines), scope)  # only our own field names and codecs: no input
        return scope["from_list"]

    def to_map(self, obj: Any) -> dict[str, Any]:
        return {name: enc(getattr(obj, name)) for name, enc, _, _ in self.fields}

    def from_map(self, data: dict[str, Any]) -> dict[str, Any]:
        """The constructor's keyword arguments; a missing field with a default is left out."""
        kwargs = {}
        for name, _, dec, has_default in self.fields:
            if name in data:
                kwargs[name] = dec(data[name], name)
            elif not has_default:
                raise ProtocolError(f"missing field {name!r}")
        return kwargs

    def to_list(self, obj: Any) -> list[Any]:
        return [enc(getattr(obj, name)) for name, enc, _, _ in self.fields]

    def from_list(self, values: Any) -> dict[str, Any]:
        """The constructor's keyword arguments from a list of every field, in order."""
        return self._from_list(values)


# -- census -------------------------------------------------------------------------------
# A tensor travels as a list of its fields in declaration order (a census may hold 100k);
# its storage key is the storage's it is listed under.
_TENSOR = _Shape(TensorInfo, skip=("storage_key",))
_SKIPPED = _Shape(Skipped)


def census_to_wire(census: Census) -> dict[str, Any]:
    """A census as nested lists: ``[device, data_ptr, nbytes, [tensor, ...]]`` per storage."""
    return {
        "storages": [
            [s.key[0], s.key[1], s.nbytes, [_TENSOR.to_list(t) for t in s.tensors]]
            for s in census.storages.values()
        ],
        "skipped": [_SKIPPED.to_list(k) for k in census.skipped],
        "duration_s": census.duration_s,
        "step": census.step,
    }


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
        for values in tensors:
            tensor = TensorInfo(storage_key=key, **_TENSOR.from_list(values))
            if tensor.kind not in KINDS:
                raise ProtocolError(f"unknown tensor kind {tensor.kind!r}")
            storage.tensors.append(tensor)
        storages[key] = storage
    skipped = [Skipped(**_SKIPPED.from_list(item)) for item in field(data, "skipped", list)]
    return Census(
        storages, skipped, _number(field(data, "duration_s", object), "duration_s"),
        field(data, "step", int),
    )  # fmt: skip


def _census_field(value: Any, name: str) -> Census:
    return census_from_wire(value)


# -- events -------------------------------------------------------------------------------
_SHAPES = {
    cls: _Shape(cls, census=(census_to_wire, _census_field)) if cls is CensusTaken else _Shape(cls)
    for cls in EVENT_NAMES
}


def event_to_wire(event: Event) -> dict[str, Any]:
    """One event as a map of its fields, with its kind under ``"e"``."""
    shape = _SHAPES.get(type(event))
    if shape is None:
        raise TypeError(f"not an event: {type(event).__name__}")
    data = shape.to_map(event)
    data["e"] = EVENT_NAMES[type(event)]
    return data


def event_from_wire(data: Any) -> Event:
    """Rebuild the event :func:`event_to_wire` wrote; ProtocolError for anything else."""
    if not isinstance(data, dict):
        raise ProtocolError("an event must be a map")
    kind = field(data, "e", str)
    cls = _EVENT_TYPES.get(kind)
    if cls is None:
        raise ProtocolError(f"unknown event kind {kind!r}")
    return cls(**_SHAPES[cls].from_map(data))

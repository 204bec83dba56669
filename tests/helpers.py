"""Helpers shared by test modules (imported from here, never from another test module)."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import jsonschema

from torchmem.resources import path as resource_path


@cache
def _summary_validator() -> jsonschema.protocols.Validator:
    schema = json.loads(resource_path("summary.schema.json").read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def check_summary(data: dict[str, Any]) -> dict[str, Any]:
    """Fail unless ``data`` follows resources/summary.schema.json; returns it."""
    errors = sorted(_summary_validator().iter_errors(data), key=lambda e: list(e.path))
    assert not errors, "summary breaks its schema:\n" + "\n".join(
        f"  {'/'.join(map(str, e.path)) or '(top)'}: {e.message}" for e in errors
    )
    return data

"""Typed reads of QSettings values.

QSettings hands back what its backend stored, not what was written: an INI file returns a
one-entry list as a plain string, and booleans as "true"/"false". A list read as it comes
is then iterated character by character ("/", "/", "."): every list read goes through here.
"""

from __future__ import annotations

from PySide6.QtCore import QSettings


def string_list(settings: QSettings, key: str) -> list[str]:
    """The non-empty strings stored under ``key``: [] when unset, one entry when the
    backend returned a lone string."""
    value = settings.value(key, [])
    items = [value] if isinstance(value, str) else list(value or [])
    return [item for item in items if isinstance(item, str) and item]

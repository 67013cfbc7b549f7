"""Altering a real effect: the values a ``missing``, ``partial`` or ``wrong`` effect leaves."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .._json import dumps

__all__ = [
    "altered",
]


# --------------------------------------------------------------------------------------------
# Altering an effect (silent and compensation faults).
# --------------------------------------------------------------------------------------------


def altered(mode: str, changes: Mapping[str, tuple[Any, Any]], u: float) -> dict[str, Any]:
    """The values the changed keys should hold for a ``missing``/``partial``/``wrong`` effect."""
    if mode == "missing":
        return {k: before for k, (before, _) in changes.items()}
    target = {k: after for k, (_, after) in changes.items()}
    keys = sorted(changes)
    if mode == "partial":
        if len(keys) > 1:
            target[keys[-1]] = changes[keys[-1]][0]
            return target
        before, after = changes[keys[0]]
        half = _partial(before, after)
        target[keys[0]] = before if half is None else half
        return target
    key = keys[int(u * len(keys)) % len(keys)]
    target[key] = _wrong(changes[key][0], changes[key][1], u)
    return target


def _partial(before: Any, after: Any) -> Any:
    """``after`` with part of its change from ``before`` undone; None if it cannot be split."""
    if isinstance(before, dict) and isinstance(after, dict):
        differ = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        if len(differ) > 1:
            out = json.loads(dumps(after))
            for k in differ[len(differ) // 2 :]:
                if k in before:
                    out[k] = before[k]
                else:
                    out.pop(k, None)
            return out
        if len(differ) == 1:
            inner = _partial(before.get(differ[0]), after.get(differ[0]))
            if inner is None:
                return None
            return {**after, differ[0]: inner}
        return None
    if isinstance(before, list) and isinstance(after, list):
        added = len(after) - len(before)
        if added > 1 and after[: len(before)] == before:
            return after[: len(before) + added // 2]
    return None


def _wrong(before: Any, after: Any, u: float) -> Any:
    """A value unlike both ``before`` and ``after``: one changed part of ``after``, perturbed."""
    if isinstance(after, dict) and isinstance(before, dict):
        differ = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        if differ:
            k = differ[int(u * len(differ)) % len(differ)]
            return {**after, k: _wrong(before.get(k), after.get(k), u)}
    if after is None:
        return before
    return _perturb(after)


def _perturb(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str):
        return value + " (garbled)"
    if isinstance(value, list):
        return value[:-1] if value else ["garbled"]
    if isinstance(value, dict) and value:
        k = sorted(value)[0]
        return {**value, k: _perturb(value[k])}
    return "garbled"

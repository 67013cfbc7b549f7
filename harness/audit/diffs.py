"""Field-level changes: what a transaction changed in a resource, as people read it.

A state diff holds a resource's whole value before and after (an order with its items and its
payment history). :func:`field_changes` walks the two values and names each field that differs:
``.status: "pending" → "cancelled"``, ``.payment_history[1]: added {...}``, so an audit shows the
change instead of two whole JSON documents side by side.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["FieldChange", "field_changes"]

_ABSENT = object()


@dataclass(frozen=True)
class FieldChange:
    """One field that differs.

    Attributes:
        path: where in the resource (``.status``, ``.items[2].price``; empty: the whole value);
            written after the resource's key (``orders/o1.status``).
        kind: ``changed``, ``added`` or ``removed`` (for the whole value: ``created`` or
            ``deleted``).
        before, after: the field's values (``None`` where it is absent).
    """

    path: str
    kind: str
    before: Any = None
    after: Any = None

    def describe(self, width: int = 80) -> str:
        """The change in one line: ``.status: "pending" → "cancelled"``."""
        where = self.path  # (empty for the whole value: "orders/o1: created {...}")
        if self.kind in ("added", "created"):
            return f"{where}: {self.kind} {_short(self.after, width)}"
        if self.kind in ("removed", "deleted"):
            return f"{where}: {self.kind} (was {_short(self.before, width)})"
        return f"{where}: {_short(self.before, width)} → {_short(self.after, width)}"


def _short(value: Any, width: int) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str, sort_keys=True)
    return text if len(text) <= width else text[: width - 1] + "…"


def field_changes(before: Any, after: Any) -> list[FieldChange]:
    """Every field of ``after`` that differs from ``before``, in document order.

    ``None`` on one side is a resource created or deleted (one change for the whole value).
    """
    if before is None and after is not None:
        return [FieldChange("", "created", None, after)]
    if after is None and before is not None:
        return [FieldChange("", "deleted", before, None)]
    out: list[FieldChange] = []
    _walk(before, after, "", out)
    return out


def _walk(before: Any, after: Any, path: str, out: list[FieldChange]) -> None:
    if isinstance(before, dict) and isinstance(after, dict):
        for key in list(before) + [k for k in after if k not in before]:
            sub = f"{path}.{key}"
            a, b = before.get(key, _ABSENT), after.get(key, _ABSENT)
            if a is _ABSENT:
                out.append(FieldChange(sub, "added", None, b))
            elif b is _ABSENT:
                out.append(FieldChange(sub, "removed", a, None))
            else:
                _walk(a, b, sub, out)
        return
    if isinstance(before, list) and isinstance(after, list):
        for i in range(max(len(before), len(after))):
            sub = f"{path}[{i}]"
            if i >= len(before):
                out.append(FieldChange(sub, "added", None, after[i]))
            elif i >= len(after):
                out.append(FieldChange(sub, "removed", before[i], None))
            else:
                _walk(before[i], after[i], sub, out)
        return
    if before != after or type(before) is not type(after):
        out.append(FieldChange(path, "changed", before, after))

"""A trial's state rebuilt from its record.

A trial's environment does not outlive its process, so a resumed or replayed trial starts from
the state its record says the episode left: the effects of its transaction rows, applied to a
fresh environment's state by the adapter's own ``apply_changes``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._json import loads
from ..errors import ConfigurationError
from ..store import TransactionRow, TxnStatus

__all__ = ["apply_changes", "recorded_changes"]


def recorded_changes(rows: Sequence[TransactionRow]) -> dict[str, Any]:
    """The resources an episode's transactions left changed: key -> value after (None: absent).

    Committed and recovered transactions count, and failed ones whose effect remained (their
    row keeps the diff); compensated ones do not. Later writes win.
    """
    out: dict[str, Any] = {}
    for row in sorted(rows, key=lambda r: r.seq):
        if not row.diff or row.status in (TxnStatus.COMPENSATED, TxnStatus.ABANDONED):
            continue
        for key, change in loads(row.diff).items():
            out[key] = change[1]
    return out


def apply_changes(state: Any, changes: Mapping[str, Any]) -> None:
    """Set each resource of ``state`` to its value in ``changes`` (None: remove it).

    :class:`~harness.DictState`, :class:`~harness.SQLState` and :class:`~harness.FileState`
    (text files) can; any other adapter needs an ``apply_changes(changes)`` method of its own.

    Raises:
        ConfigurationError: the adapter cannot be written this way.
    """
    if not changes:
        return
    hook = getattr(state, "apply_changes", None)
    if not callable(hook):
        raise ConfigurationError(
            f"cannot rebuild the recorded state on {type(state).__name__}: give the adapter an "
            "apply_changes(changes) method (key -> value, None to remove)"
        )
    hook(changes)

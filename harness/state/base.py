"""The state adapter protocol and the helpers every adapter shares."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, TypeVar, runtime_checkable

__all__ = ["WINDOW_LEASE", "Change", "ScopeMatcher", "StateAdapter", "diff", "escape_glob"]

WINDOW_LEASE = 600.0
"""Seconds a SQL adapter's change window records other connections' writes after it was last
used (opened, or read with ``others``): the bound on what a process killed inside a window
leaves recording. The adapter's own writes are recorded for as long as its window is open."""

Change = tuple[Any, Any]
"""``(before, after)`` values of one resource; ``None`` means absent."""

_GLOB = re.compile(r"[*?\[]")
_ESCAPED = re.compile(r"\[([*?\[])\]")


def escape_glob(text: str) -> str:
    """``text`` as a pattern that matches only itself (``*`` becomes ``[*]``, as fnmatch reads)."""
    if not _GLOB.search(text):
        return text
    return re.sub(r"([*?\[])", r"[\1]", text)


def _literal(pattern: str) -> str | None:
    """The one key ``pattern`` matches when its only glob characters are escaped, else None."""
    if _GLOB.search(_ESCAPED.sub("", pattern)):
        return None
    return _ESCAPED.sub(r"\1", pattern)


@runtime_checkable
class StateAdapter(Protocol):
    """The harness's view of external state: keyed resources it can read and track.

    Change tracking is the hot path: ``mark()`` starts a window and ``changes(mark)`` returns
    the resources written since, with their value at ``mark`` time. Its cost grows with what
    was written, not with the size of the state.
    """

    def get(self, key: str) -> Any | None:
        """The resource's current value, or ``None`` when it does not exist."""
        ...

    def snapshot(self, keys: Iterable[str]) -> dict[str, Any]:
        """Current values of ``keys`` (``None`` for absent ones)."""
        ...

    def mark(self) -> Any:
        """Start a change-tracking window; returns an opaque token."""
        ...

    def changes(self, mark: Any) -> dict[str, Any]:
        """Resources written since ``mark``, each with its value at ``mark`` time."""
        ...

    def release(self, mark: Any) -> None:
        """End the window started by ``mark``."""
        ...

    def fingerprint(self) -> str:
        """A digest of the whole state (off the hot path: verifiers and audits use it)."""
        ...


def diff(adapter: StateAdapter, before: Mapping[str, Any]) -> dict[str, Change]:
    """``{key: (before, after)}`` for the keys in ``before`` whose value is now different."""
    out: dict[str, Change] = {}
    for key, old in before.items():
        new = adapter.get(key)
        if new != old:
            out[key] = (old, new)
    return out


class ScopeMatcher:
    """Resolved ``writes`` patterns: literal keys by set lookup, globs by fnmatch."""

    __slots__ = ("globs", "literal")

    def __init__(self, patterns: Iterable[str]) -> None:
        self.literal: set[str] = set()
        self.globs: list[re.Pattern[str]] = []
        for pattern in patterns:
            literal = _literal(pattern) if _GLOB.search(pattern) else pattern
            if literal is None:
                self.globs.append(re.compile(fnmatch.translate(pattern)))
            else:
                self.literal.add(literal)

    def __contains__(self, key: object) -> bool:
        if key in self.literal:
            return True
        return isinstance(key, str) and any(g.match(key) for g in self.globs)

    def outside(self, keys: Iterable[str]) -> list[str]:
        """The keys that no pattern covers, sorted."""
        return sorted(k for k in keys if k not in self)


class _Keyed(Protocol):
    @property
    def pk(self) -> tuple[str, ...]: ...


_T = TypeVar("_T", bound=_Keyed)


def split_resource(key: str, tables: Mapping[str, _T]) -> tuple[_T, list[str]]:
    """The table a ``table/key`` resource names, and its key's values (a composite key is
    joined with ``,``; a table without a primary key is addressed by one value, its rowid).

    Raises:
        KeyError: no such table, or a key with another number of values than the table's.
    """
    name, _, pk = key.partition("/")
    table = tables.get(name)
    if table is None:
        raise KeyError(f"no table {name!r} for resource {key!r}; tables: {sorted(tables)}")
    width = max(len(table.pk), 1)
    parts = pk.split(",") if width > 1 else [pk]
    if len(parts) != width:
        raise KeyError(f"resource {key!r}: table {name!r} has key {','.join(table.pk)}")
    return table, parts

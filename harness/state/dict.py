"""``DictState``: an in-memory mapping of resources, written through the adapter."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from typing import Any

from .._json import digest

__all__ = ["DictState"]

_ATOMS = (str, int, float, bool, type(None))
_ATOM_TYPES = frozenset(_ATOMS)


def _copy(value: Any) -> Any:
    """A deep copy, fast for the JSON-shaped values resources usually are (plain values are
    kept as they are without a call)."""
    kind = type(value)
    if kind is dict:
        return {k: v if type(v) in _ATOM_TYPES else _copy(v) for k, v in value.items()}
    if kind is list:
        return [v if type(v) in _ATOM_TYPES else _copy(v) for v in value]
    if isinstance(value, _ATOMS):
        return value
    return copy.deepcopy(value)


class _Read:
    """A copy handed out while a change window is open, with the value it was handed out as."""

    __slots__ = ("done", "handed", "key", "pristine")

    def __init__(self, key: str, handed: Any, pristine: Any) -> None:
        self.key, self.handed, self.pristine = key, handed, pristine
        self.done = False  # written back, or reported

    def lost(self, stored: Any) -> bool:
        """Changed in place, never written back, and unlike what the state now holds."""
        return not self.done and self.handed != self.pristine and self.handed != stored


class DictState(MutableMapping[str, Any]):
    """Resources in a dict; tools write with ``state[key] = value`` or ``del state[key]``.

    Reads return copies, so a tool cannot change a resource behind the adapter's back; every
    write goes through ``__setitem__``/``__delitem__``, which journal the old value for each open
    change-tracking window. ``changes()`` therefore costs what was written, nothing more.

    A tool that changes a copy it read and forgets to write it back would change nothing, and
    only a postcondition could tell. So while a window is open, the copies ``state[key]`` and
    ``get`` hand out are remembered, and :meth:`unwritten` names the keys whose copy was
    changed in place and never written back (to its key, or, that very object, to any key).
    The engine fails a call that did so to a key in its own ``writes`` scope; a read-only tool
    editing its copy to build a reply is no error. Reads outside windows remember nothing.
    """

    def __init__(self, data: Iterable[tuple[str, Any]] | dict[str, Any] | None = None) -> None:
        self._data: dict[str, Any] = dict(data or {})
        # Per open window: its journal (key -> value before its first write) and where its
        # reads start in ``_reads``.
        self._windows: dict[int, tuple[dict[str, Any], int]] = {}
        # The copies handed out while a window is open, in order, by object and by key.
        self._reads: list[_Read] = []
        self._read_ids: dict[int, _Read] = {}
        self._reads_of: dict[str, list[_Read]] = {}
        self._next = 0

    def _hand_out(self, key: str, value: Any) -> Any:
        """A copy of ``value`` for a read in a window, remembered unless it is a plain value."""
        handed = _copy(value)
        if type(value) not in _ATOM_TYPES:
            read = _Read(key, handed, _copy(value))
            self._reads.append(read)
            self._read_ids[id(handed)] = read  # unique: the read keeps the copy alive
            self._reads_of.setdefault(key, []).append(read)
        return handed

    def _written(self, key: str, value: Any) -> None:
        """Mark the copies ``state[key] = value`` settles: that very object (written under any
        key), and every copy read from ``key`` before (the key was written after its read,
        whatever the value: ``state[k] = {**order, "reason": ...}`` writes a change back)."""
        read = self._read_ids.get(id(value))
        if read is not None:
            read.done = True
        for read in self._reads_of.get(key, ()):
            read.done = True

    # --- mapping interface (the tools' view) ---
    def __getitem__(self, key: str) -> Any:
        value = self._data[key]
        return self._hand_out(key, value) if self._windows else _copy(value)

    def __setitem__(self, key: str, value: Any) -> None:
        self._journal(key)
        if self._reads:
            self._written(key, value)
        self._data[key] = _copy(value)

    def __delitem__(self, key: str) -> None:
        if key not in self._data:
            raise KeyError(key)
        self._journal(key)
        del self._data[key]

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def pop(self, key: str, *default: Any) -> Any:
        """Remove ``key`` and return its value (which is no longer the state's to track)."""
        if key not in self._data:
            if default:
                return default[0]
            raise KeyError(key)
        value = _copy(self._data[key])
        del self[key]
        return value

    def popitem(self) -> tuple[str, Any]:
        if not self._data:
            raise KeyError("popitem(): the state is empty")
        key = next(iter(self._data))
        return key, self.pop(key)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._data))

    def __len__(self) -> int:
        return len(self._data)

    def _journal(self, key: str) -> None:
        for window, _ in self._windows.values():
            if key not in window:
                window[key] = _copy(self._data.get(key))

    # --- adapter interface (the harness's view) ---
    def get(self, key: str, default: Any = None) -> Any:
        value = self._data.get(key)
        if value is None:
            return default
        return self._hand_out(key, value) if self._windows else _copy(value)

    def snapshot(self, keys: Iterable[str]) -> dict[str, Any]:
        return {k: _copy(self._data.get(k)) for k in keys}

    def mark(self) -> int:
        self._next += 1
        self._windows[self._next] = ({}, len(self._reads))
        return self._next

    def changes(self, mark: int) -> dict[str, Any]:
        """The window's writes, with their before values."""
        return dict(self._windows.get(mark, ({}, 0))[0])

    def unwritten(self, mark: int) -> list[str]:
        """Keys read in the window whose copy was changed in place and not written back
        (sorted; each read is reported once)."""
        first = self._windows.get(mark, ({}, len(self._reads)))[1]
        if first == len(self._reads):
            return []
        lost = [r for r in self._reads[first:] if r.lost(self._data.get(r.key))]
        for read in lost:
            read.done = True
        return sorted({r.key for r in lost})

    def release(self, mark: int) -> None:
        self._windows.pop(mark, None)
        if not self._windows and self._reads:
            self._reads.clear()
            self._read_ids.clear()
            self._reads_of.clear()

    def fingerprint(self) -> str:
        return digest(self._data)

    def apply_changes(self, changes: Mapping[str, Any]) -> None:
        """Set each key to its value in ``changes`` (None: remove it), as a record says."""
        for key, value in changes.items():
            if value is None:
                self.pop(key, None)
            else:
                self[key] = value

    def to_dict(self) -> dict[str, Any]:
        """A deep copy of every resource."""
        return {k: _copy(v) for k, v in self._data.items()}

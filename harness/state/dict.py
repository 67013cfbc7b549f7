"""``DictState``: an in-memory mapping of resources, written through the adapter."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, MutableMapping
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


class DictState(MutableMapping[str, Any]):
    """Resources in a dict; tools write with ``state[key] = value`` or ``del state[key]``.

    Reads return copies, so a tool cannot change a resource behind the adapter's back; every
    write goes through ``__setitem__``/``__delitem__``, which journal the old value for each open
    change-tracking window. ``changes()`` therefore costs what was written, nothing more.
    """

    def __init__(self, data: Iterable[tuple[str, Any]] | dict[str, Any] | None = None) -> None:
        self._data: dict[str, Any] = dict(data or {})
        self._windows: dict[int, dict[str, Any]] = {}
        self._next = 0

    # --- mapping interface (the tools' view) ---
    def __getitem__(self, key: str) -> Any:
        return _copy(self._data[key])

    def __setitem__(self, key: str, value: Any) -> None:
        self._journal(key)
        self._data[key] = _copy(value)

    def __delitem__(self, key: str) -> None:
        if key not in self._data:
            raise KeyError(key)
        self._journal(key)
        del self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._data))

    def __len__(self) -> int:
        return len(self._data)

    def _journal(self, key: str) -> None:
        for window in self._windows.values():
            if key not in window:
                window[key] = _copy(self._data.get(key))

    # --- adapter interface (the harness's view) ---
    def get(self, key: str, default: Any = None) -> Any:
        value = self._data.get(key)
        return default if value is None else _copy(value)

    def snapshot(self, keys: Iterable[str]) -> dict[str, Any]:
        return {k: _copy(self._data.get(k)) for k in keys}

    def mark(self) -> int:
        self._next += 1
        self._windows[self._next] = {}
        return self._next

    def changes(self, mark: int) -> dict[str, Any]:
        return dict(self._windows.get(mark, {}))

    def release(self, mark: int) -> None:
        self._windows.pop(mark, None)

    def fingerprint(self) -> str:
        return digest(self._data)

    def to_dict(self) -> dict[str, Any]:
        """A deep copy of every resource."""
        return {k: _copy(v) for k, v in self._data.items()}

"""``FileState``: files under a folder as resources keyed by relative POSIX path."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .._json import digest
from ..errors import ConfigurationError

__all__ = ["FileState"]

_Sig = tuple[int, int, int]
_TICK_NS = 50_000_000


class FileState:
    """Files as resources: ``get("src/app.py")`` returns its text (or ``sha256:...`` if binary).

    Tools write files directly. Change tracking compares ``stat`` signatures (mtime, size,
    inode) and reads only the files whose signature moved; a content cache keeps each file's
    last known value, so a change window pays for the files it touched, not for the tree.

    Args:
        root: the folder; ignored names (``.git`` by default) are not tracked.
        ignore: directory or file names to skip anywhere in the tree.
    """

    def __init__(self, root: str | Path, *, ignore: Iterable[str] = (".git",)) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise ConfigurationError(
                f"FileState({str(root)!r}): not a folder; create it or give an existing folder"
            )
        self.ignore = frozenset(ignore)
        self._cache: dict[str, tuple[_Sig, Any]] = {}
        self._windows: dict[int, tuple[int, dict[str, _Sig], dict[str, Any]]] = {}
        self._next = 0

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root.resolve()):
            raise KeyError(f"resource {key!r} is outside the folder {self.root}")
        return path

    @staticmethod
    def _read(path: Path) -> Any:
        data = path.read_bytes()
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return "sha256:" + hashlib.sha256(data).hexdigest()

    def _scan(self) -> dict[str, _Sig]:
        sigs: dict[str, _Sig] = {}
        root = str(self.root)
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d not in self.ignore]
            rel = os.path.relpath(dirpath, root)
            prefix = "" if rel == "." else rel.replace(os.sep, "/") + "/"
            for name in filenames:
                if name in self.ignore:
                    continue
                st = os.stat(os.path.join(dirpath, name))
                sigs[prefix + name] = (st.st_mtime_ns, st.st_size, st.st_ino)
        return sigs

    def _refresh_cache(self, sigs: dict[str, _Sig]) -> None:
        racy = time.time_ns() - 2 * _TICK_NS
        for key, sig in sigs.items():
            cached = self._cache.get(key)
            if cached is None or cached[0] != sig or sig[0] >= racy:
                self._cache[key] = (sig, self._read(self.root / key))
        for key in set(self._cache) - set(sigs):
            del self._cache[key]

    # --- adapter interface ---
    def get(self, key: str) -> Any | None:
        path = self._path(key)
        return self._read(path) if path.is_file() else None

    def snapshot(self, keys: Iterable[str]) -> dict[str, Any]:
        return {k: self.get(k) for k in keys}

    def mark(self) -> int:
        sigs = self._scan()
        self._refresh_cache(sigs)
        self._next += 1
        # Each window keeps the values it started from: the shared cache moves on with later
        # (nested) windows, but this window's "before" must not.
        values = {k: self._cache[k][1] for k in sigs}
        self._windows[self._next] = (time.time_ns(), sigs, values)
        return self._next

    def changes(self, mark: int) -> dict[str, Any]:
        started, then, values = self._windows.get(mark, (0, {}, {}))
        now = self._scan()
        out: dict[str, Any] = {}
        # Like git's "racily clean" entries: a file whose mtime is not clearly older than the
        # window may have been rewritten within one timestamp tick at the same size.
        racy = started - _TICK_NS
        for key in then.keys() | now.keys():
            old, new = then.get(key), now.get(key)
            if old != new:
                out[key] = values.get(key)
            elif (
                new is not None
                and new[0] >= racy
                and key in values
                and self._read(self.root / key) != values[key]
            ):
                out[key] = values[key]
        return out

    def release(self, mark: int) -> None:
        self._windows.pop(mark, None)

    def fingerprint(self) -> str:
        sigs = self._scan()
        self._refresh_cache(sigs)
        return digest({k: self._cache[k][1] for k in sorted(sigs)})

    def to_dict(self) -> dict[str, Any]:
        """Every tracked file's current value."""
        sigs = self._scan()
        self._refresh_cache(sigs)
        return {k: self._cache[k][1] for k in sorted(sigs)}

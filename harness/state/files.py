"""``FileState``: files under a folder as resources keyed by relative POSIX path.

Symbolic links are resources of their own, never followed: a link's value is ``"symlink:"``
and the text it points to, so nothing outside the folder is ever read, and creating,
retargeting or removing a link is a change of its key.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import stat
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .._json import digest
from ..errors import ConfigurationError

__all__ = ["FileState"]

# (mtime, size, inode, link target): the target is "" for a file, so a link retargeted within
# one timestamp tick at the same size still differs.
_Sig = tuple[int, int, int, str]
_TICK_NS = 50_000_000
_LINK = "symlink:"


class FileState:
    """Files as resources: ``get("src/app.py")`` returns its text (or ``sha256:...`` if binary).

    A symbolic link is a resource whose value is ``"symlink:<target>"``; it is not followed,
    and what lies behind a link to a folder is not tracked (``get`` of a path through one is
    ``None``). Nothing outside the folder is read.

    Tools write files directly. Change tracking compares ``lstat`` signatures (mtime, size,
    inode, and a link's target) and reads only the files whose signature moved; a content cache
    keeps each file's last known value, so a change window pays for the files it touched, not
    for the tree.

    Args:
        root: the folder; ignored names (``.git`` by default) are not tracked.
        ignore: directory or file names to skip anywhere in the tree.
    """

    def __init__(self, root: str | os.PathLike[str], *, ignore: Iterable[str] = (".git",)) -> None:
        if not isinstance(root, str | os.PathLike) or not isinstance(os.fspath(root), str):
            raise ConfigurationError(
                f"FileState(root={root!r}): give a folder path (str or Path), "
                f"not {type(root).__name__}"
            )
        try:
            names = None if isinstance(ignore, str | bytes) else frozenset(ignore)
        except TypeError:  # not iterable, or unhashable items
            names = None
        if names is None or not all(isinstance(n, str) for n in names):
            raise ConfigurationError(
                f"FileState(ignore={ignore!r}): give a list of file or folder names, such as "
                '[".git", "__pycache__"]'
            )
        self.root = Path(root)
        if not self.root.is_dir():
            raise ConfigurationError(
                f"FileState({str(root)!r}): not a folder; create it or give an existing folder"
            )
        self.ignore = names
        self._cache: dict[str, tuple[_Sig, Any]] = {}
        self._windows: dict[int, tuple[int, dict[str, _Sig], dict[str, Any]]] = {}
        self._next = 0

    def _path(self, key: str) -> Path | None:
        """Where resource ``key`` is, or None when a folder on its way is a link (what lies
        behind a link is not tracked)."""
        parts = posixpath.normpath(key).split("/")
        if posixpath.isabs(key) or parts[0] == "..":
            raise KeyError(f"resource {key!r} is outside the folder {self.root}")
        folder = self.root
        for part in parts[:-1]:
            folder = folder / part
            if folder.is_symlink():
                return None
        return folder / parts[-1]

    @staticmethod
    def _read(path: Path) -> Any:
        """The value of the file or link at ``path``, which is not followed if it is a link."""
        if stat.S_ISLNK(os.lstat(path).st_mode):
            return _LINK + os.readlink(path)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with open(fd, "rb") as f:
            data = f.read()
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return "sha256:" + hashlib.sha256(data).hexdigest()

    def _scan(self) -> dict[str, _Sig]:
        """Signatures of every file and link, without following links."""
        sigs: dict[str, _Sig] = {}
        folders = [("", os.fspath(self.root))]
        while folders:
            prefix, folder = folders.pop()
            with os.scandir(folder) as entries:
                for entry in entries:
                    if entry.name in self.ignore:
                        continue
                    key = prefix + entry.name
                    if entry.is_dir(follow_symlinks=False):
                        folders.append((key + "/", entry.path))
                        continue
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISLNK(st.st_mode):
                        target = os.readlink(entry.path)
                        sigs[key] = (st.st_mtime_ns, st.st_size, st.st_ino, target)
                    elif stat.S_ISREG(st.st_mode):
                        sigs[key] = (st.st_mtime_ns, st.st_size, st.st_ino, "")
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
        if path is None or not (path.is_symlink() or path.is_file()):
            return None
        return self._read(path)

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

    def apply_changes(self, changes: Mapping[str, Any]) -> None:
        """Write each file to its recorded text (None: remove it).

        Raises:
            ConfigurationError: the record holds only a digest of a binary file.
        """
        root = Path(self.root)
        for key, value in changes.items():
            path = root / key
            if value is None:
                path.unlink(missing_ok=True)
            elif isinstance(value, str) and not value.startswith("sha256:"):
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(value, encoding="utf-8")
            else:
                raise ConfigurationError(
                    f"cannot rebuild {key!r} under {root}: the record holds only a digest of its "
                    "binary content"
                )

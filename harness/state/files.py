"""``FileState``: files under a folder as resources keyed by relative POSIX path.

Symbolic links are resources of their own, never followed: a link's value is ``"symlink:"``
and the text it points to, so nothing outside the folder is ever read, and creating,
retargeting or removing a link is a change of its key.

The harness's own files are never resources, wherever they are under the folder and whichever
process writes them: a harness store is recognised by what it holds (a SQLite database with the
harness's ``hx_log`` table), its SQLite sidecars and its JSON-lines log by their names beside
it, and a run folder by its store and ``evidence.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import sqlite3
import stat
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from .._json import digest
from ..errors import ConfigurationError

__all__ = ["FileState"]

# (mtime, size, inode, link target): the target is "" for a file, so a link retargeted within
# one timestamp tick at the same size still differs.
_Sig = tuple[int, int, int, str]
_TICK_NS = 50_000_000
_LINK = "symlink:"

_SQLITE_HEADER = b"SQLite format 3\x00"
_SQLITE_MIN_SIZE = 512  # the smallest page: a shorter file holds no table
_SIDECARS = ("-wal", "-shm", "-journal")
# A run folder (see harness/runs/layout.py) holds its store under this name and writes this
# file as the run starts; everything else in it (the summary, the JSON lines, exports and
# reports, their temporary files) is the harness's too.
_RUN_STORE = "harness.db"
_RUN_MARKER = "evidence.json"
# Every line of the JSON-lines log starts with the ids the episode binds, then carries these.
_LOG_START = b'{"episode_id":'
_LOG_KEYS = frozenset({"episode_id", "run_id", "event", "level", "ts"})
_GLOB_CHARS = re.compile(r"[*?\[]")
_IGNORE_EXAMPLE = '[".git", "__pycache__", "*.log", "cache/**", "tmp/*.txt"]'


def _segment_regex(segment: str) -> str:
    """The regex of one path segment of a glob: ``*`` and ``?`` never match ``/``."""
    out: list[str] = []
    i, n = 0, len(segment)
    while i < n:
        c = segment[i]
        i += 1
        if c == "*":
            while i < n and segment[i] == "*":
                i += 1
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = i + 1 if i < n and segment[i] in "!^" else i
            j = j + 1 if j < n and segment[j] == "]" else j
            while j < n and segment[j] != "]":
                j += 1
            if j >= n:  # no closing bracket: a literal "[", as fnmatch reads it
                out.append(re.escape(c))
                continue
            body, i = segment[i:j], j + 1
            negate = body[:1] in ("!", "^")
            body = "".join(ch if ch == "-" else re.escape(ch) for ch in body[negate:])
            out.append(f"[^/{body}]" if negate else f"[{body}]")
        else:
            out.append(re.escape(c))
    return "".join(out)


def _path_regex(parts: list[str]) -> str:
    """The regex of a glob over relative paths: ``**`` as a whole segment is any depth."""
    out = ""
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            out += ".*" if last else "(?:.*/)?"
        else:
            out += _segment_regex(part) + ("" if last else "/")
    return out


def _either(regexes: list[str]) -> re.Pattern[str] | None:
    return re.compile("|".join(f"(?:{r})" for r in regexes), re.S) if regexes else None


@dataclass(frozen=True)
class _Ignore:
    """What a scan skips: names and name patterns anywhere in the tree, path patterns from the
    root; the ``dir_`` ones (written with a trailing ``/``) apply to folders only."""

    names: frozenset[str]
    dir_names: frozenset[str]
    name: re.Pattern[str] | None
    dir_name: re.Pattern[str] | None
    path: re.Pattern[str] | None
    dir_path: re.Pattern[str] | None

    @property
    def patterns(self) -> bool:
        return any((self.dir_names, self.name, self.dir_name, self.path, self.dir_path))

    def skips(self, key: str, name: str, is_dir: bool) -> bool:
        """Whether the entry at ``key`` (named ``name``) is left out, with all under it."""
        if self.name is not None and self.name.fullmatch(name):
            return True
        # A folder whose path followed by "/" matches ("cache/**", "tmp/*") holds only
        # entries the pattern matches: skip it whole.
        if self.path is not None and (
            self.path.fullmatch(key) or (is_dir and self.path.fullmatch(key + "/"))
        ):
            return True
        if not is_dir:
            return False
        if name in self.dir_names:
            return True
        if self.dir_name is not None and self.dir_name.fullmatch(name):
            return True
        return self.dir_path is not None and bool(
            self.dir_path.fullmatch(key) or self.dir_path.fullmatch(key + "/")
        )


def _parse_ignore(ignore: Any) -> tuple[frozenset[str], _Ignore]:
    """The patterns of ``FileState(ignore=...)``, checked, and what a scan makes of them.

    Raises:
        ConfigurationError: not a list of strings, or a pattern that is empty, absolute or
            leaves the folder (``..``).
    """
    try:
        given = None if isinstance(ignore, str | bytes) else frozenset(ignore)
    except TypeError:  # not iterable, or unhashable items
        given = None
    if given is None or not all(isinstance(p, str) for p in given):
        raise ConfigurationError(
            f"FileState(ignore={ignore!r}): give a list of file or folder names or glob "
            f"patterns of paths relative to the folder, such as {_IGNORE_EXAMPLE}"
        )
    names: set[str] = set()
    dir_names: set[str] = set()
    name: list[str] = []
    dir_name: list[str] = []
    path: list[str] = []
    dir_path: list[str] = []
    for pattern in sorted(given):
        why = ""
        if not pattern.strip():
            why = "is blank"
        elif pattern.startswith("/") or "\x00" in pattern:
            why = "is not a path relative to the folder"
        parts = [p for p in pattern.split("/") if p not in ("", ".")]
        if not why and ".." in parts:
            why = "leaves the folder"
        elif not why and not parts:
            why = "names the folder itself"
        if why:
            raise ConfigurationError(
                f"FileState(ignore=[..., {pattern!r}, ...]): {pattern!r} {why}; give names or "
                f"glob patterns of paths relative to the folder, such as {_IGNORE_EXAMPLE}"
            )
        folders_only = pattern.endswith("/")
        if len(parts) == 1 and not _GLOB_CHARS.search(parts[0]):
            (dir_names if folders_only else names).add(parts[0])
        elif len(parts) == 1:
            (dir_name if folders_only else name).append(_segment_regex(parts[0]))
        else:
            (dir_path if folders_only else path).append(_path_regex(parts))
    compiled = _Ignore(
        frozenset(names),
        frozenset(dir_names),
        _either(name),
        _either(dir_name),
        _either(path),
        _either(dir_path),
    )
    return given, compiled


@dataclass(frozen=True)
class _Owned:
    """The harness's own files found by one scan: exact keys, and whole folders (prefixes
    ending in ``/``; ``""`` when the root itself is a run folder)."""

    keys: frozenset[str] = frozenset()
    folders: tuple[str, ...] = ()

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and (
            key in self.keys or (bool(self.folders) and key.startswith(self.folders))
        )


_NOTHING = _Owned()


def _starts_like_sqlite(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with open(fd, "rb") as f:
            return f.read(len(_SQLITE_HEADER)) == _SQLITE_HEADER
    except OSError:
        return False


def _holds_harness_log(path: Path, in_use: bool) -> bool | None:
    """Whether the SQLite database at ``path`` has the harness's ``hx_log`` table; None when
    it cannot be told now (locked, or gone).

    ``in_use``: a ``-wal`` or ``-journal`` is beside it.
    """
    # In use, the schema may be only in the write-ahead log, and a connection of this process
    # may hold locks on the file: read it through SQLite, which keeps them (a reader never
    # blocks a writer in WAL mode). Otherwise the file is the whole database: read it
    # immutable, which takes no lock and creates no file.
    mode = "mode=ro" if in_use else "mode=ro&immutable=1"
    try:
        conn = sqlite3.connect(f"{path.absolute().as_uri()}?{mode}", uri=True, timeout=0.1)
    except sqlite3.Error:
        return None
    try:
        query = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'hx_log'"
        return conn.execute(query).fetchone() is not None
    except sqlite3.OperationalError:  # busy, locked, cannot open: ask again next scan
        return None
    except sqlite3.DatabaseError:  # not a database after all, or torn by a writer
        return False
    finally:
        conn.close()


def _is_harness_log(path: str) -> bool:
    """Whether the file's first line is a line of the harness's JSON-lines log."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with open(fd, "rb") as f:
            head = f.read(65536)
    except OSError:
        return False
    line, newline, _ = head.partition(b"\n")
    if not newline or not line.startswith(_LOG_START):
        return False
    try:
        first = json.loads(line)
    except ValueError:
        return False
    return isinstance(first, dict) and first.keys() >= _LOG_KEYS


class FileState:
    """Files as resources: ``get("src/app.py")`` returns its text (or ``sha256:...`` if binary).

    A symbolic link is a resource whose value is ``"symlink:<target>"``; it is not followed,
    and what lies behind a link to a folder is not tracked (``get`` of a path through one is
    ``None``). Nothing outside the folder is read.

    Tools write files directly. Change tracking compares ``lstat`` signatures (mtime, size,
    inode, and a link's target) and reads only the files whose signature moved; a content cache
    keeps each file's last known value, so a change window pays for the files it touched, not
    for the tree.

    The harness's own files are never resources, wherever they are under the folder and
    whichever process writes them (``harness run`` in the same folder, another episode's store):

    - a harness store: a SQLite database holding the harness's ``hx_log`` table, recognised by
      its content whatever its name. A file of 512 bytes or more is looked at once per
      signature: its first 16 bytes are read, or, when a ``-wal`` or ``-journal`` is beside it,
      it is opened only through SQLite, and a sidecar is never opened (closing a plain
      descriptor of a file drops every POSIX lock this process's SQLite connections hold on
      it, a ``-shm``'s WAL locks too). A SQLite database is then asked for its
      tables read-only, once per signature of the file and its ``-wal`` (without one,
      immutable: no lock taken, no file created), and a store stays known while its inode is
      the same;
    - beside a store, by name: its ``-wal``, ``-shm`` and ``-journal`` files and its JSON-lines
      log (``harness.db`` -> ``harness.jsonl``); a ``.jsonl`` file anywhere whose first line is
      one of the harness's log lines (a Postgres store's log) too;
    - a run folder: a folder whose ``harness.db`` is a store and that holds ``evidence.json``,
      with everything in it.

    A file that was the harness's at either end of a change window is no change of that window.
    Telling them apart costs a dictionary look-up per file in a scan, and the 16-byte read once
    per new signature: a warm scan of 10,000 files measured 83 ms instead of 75 ms.

    Isolation: FileState cannot tell which process wrote a file, so every change in a window is
    seen, whoever made it. Leave out the files other programs own with ``ignore=``.

    Args:
        root: the folder.
        ignore: what to leave out, with everything under it (``.git`` by default). A name
            without ``/`` (``"__pycache__"``) or a pattern without ``/`` (``"*.log"``) is
            matched against each file's and folder's name anywhere in the tree; a pattern with
            ``/`` is a glob of paths relative to the folder (``"tmp/*.txt"``; ``*``, ``?`` and
            ``[...]`` stay within one folder, a ``**`` segment spans any number:
            ``"cache/**"``, ``"**/build"``). A trailing ``/`` limits a pattern to folders.

    Raises:
        ConfigurationError: ``root`` is not a folder, or ``ignore`` is not a list of names and
            patterns (or holds one that is empty, absolute or leaves the folder).
    """

    # FileState cannot tell which process wrote a file, so every change in a window is seen,
    # whoever made it: a change outside a call's scope may be another writer's.
    attributes_writes = False

    def __init__(self, root: str | os.PathLike[str], *, ignore: Iterable[str] = (".git",)) -> None:
        if not isinstance(root, str | os.PathLike) or not isinstance(os.fspath(root), str):
            raise ConfigurationError(
                f"FileState(root={root!r}): give a folder path (str or Path), "
                f"not {type(root).__name__}"
            )
        self.ignore, self._ignore = _parse_ignore(ignore)
        self.root = Path(root)
        if not self.root.is_dir():
            raise ConfigurationError(
                f"FileState({str(root)!r}): not a folder; create it or give an existing folder"
            )
        self._cache: dict[str, tuple[_Sig, Any]] = {}
        self._windows: dict[int, tuple[int, dict[str, _Sig], dict[str, Any], _Owned]] = {}
        self._next = 0
        # What the scans learnt about the harness's own files, by signature (see the class
        # docstring): whether a file starts like a SQLite database; whether a database (with
        # its -wal's signature) holds the harness's log; inodes of stores and logs found.
        self._headers: dict[str, tuple[_Sig, bool]] = {}
        self._probes: dict[str, tuple[_Sig, _Sig | None, bool]] = {}
        self._log_probes: dict[str, tuple[_Sig, bool]] = {}
        self._stores: dict[str, int] = {}
        self._logs: dict[str, int] = {}

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

    def _scan(self) -> tuple[dict[str, _Sig], _Owned]:
        """Signatures of every tracked file and link, without following links, and the
        harness's own files this scan found (left out of the signatures)."""
        sigs: dict[str, _Sig] = {}
        databases: list[str] = []
        unread: list[tuple[str, str, _Sig]] = []
        logs: list[str] = []
        headers = self._headers
        ignore = self._ignore
        names, patterns = ignore.names, ignore.patterns
        is_reg, is_link = stat.S_ISREG, stat.S_ISLNK
        folders = [("", os.fspath(self.root))]
        while folders:
            prefix, folder = folders.pop()
            with os.scandir(folder) as entries:
                for entry in entries:
                    name = entry.name
                    if name in names:
                        continue
                    key = prefix + name
                    is_dir = entry.is_dir(follow_symlinks=False)
                    if patterns and ignore.skips(key, name, is_dir):
                        continue
                    if is_dir:
                        folders.append((key + "/", entry.path))
                        continue
                    st = entry.stat(follow_symlinks=False)
                    if is_reg(st.st_mode):
                        size = st.st_size
                        sig = sigs[key] = (st.st_mtime_ns, size, st.st_ino, "")
                        if size >= _SQLITE_MIN_SIZE:
                            seen = headers.get(key)
                            if seen is None or seen[0] != sig:
                                unread.append((key, entry.path, sig))
                            elif seen[1]:
                                databases.append(key)
                        if name.endswith(".jsonl"):
                            logs.append(key)
                    elif is_link(st.st_mode):
                        target = os.readlink(entry.path)
                        sigs[key] = (st.st_mtime_ns, st.st_size, st.st_ino, target)
        for key, path, sig in unread:
            # POSIX locks belong to the process: closing any descriptor of a file drops every
            # lock this process holds on it, those of its SQLite connections too. So a sidecar
            # (a -shm holds the WAL locks) is never opened, and a file SQLite may be using (a
            # -wal or -journal beside it) is opened only through SQLite.
            if key.endswith(_SIDECARS):
                headers[key] = (sig, False)
                continue
            in_use = key + "-wal" in sigs or key + "-journal" in sigs
            headers[key] = (sig, in_use or _starts_like_sqlite(path))
            if headers[key][1]:
                databases.append(key)
        if len(headers) > 2 * len(sigs) + 64:  # forget files long gone, now and then
            self._headers = {k: v for k, v in headers.items() if k in sigs}
        owned = self._owned(sigs, databases, logs)
        for key in owned.keys:
            sigs.pop(key, None)
        if owned.folders:
            sigs = {k: v for k, v in sigs.items() if not k.startswith(owned.folders)}
        return sigs, owned

    def _owned(self, sigs: dict[str, _Sig], databases: list[str], logs: list[str]) -> _Owned:
        """The harness's files among ``sigs``: stores among ``databases`` (files that start
        like SQLite), their sidecars and logs, harness logs among ``logs``, run folders."""
        if not databases and not logs and not self._stores:
            return _NOTHING
        stores: list[str] = []
        unsure: list[str] = []
        probes: dict[str, tuple[_Sig, _Sig | None, bool]] = {}
        for key in databases:
            sig = sigs[key]
            if self._stores.get(key) == sig[2]:
                stores.append(key)
                continue
            wal = sigs.get(key + "-wal")
            probe = self._probes.get(key)
            if probe is None or probe[0] != sig or probe[1] != wal:
                in_use = wal is not None or key + "-journal" in sigs
                verdict = _holds_harness_log(self.root / key, in_use)
                if verdict is None:
                    # Cannot tell now (ask again next scan): leave it and what is beside it
                    # out of this scan rather than read a store with a plain open.
                    unsure.append(key)
                    continue
                probe = (sig, wal, verdict)
            probes[key] = probe
            if probe[2]:
                stores.append(key)
                self._stores[key] = sig[2]
            else:
                self._stores.pop(key, None)
        self._probes = probes
        # A store known from an earlier scan and gone now: what is left beside it is its own.
        stores += [k for k in list(self._stores) if k not in sigs]
        keys: set[str] = set()
        folders: list[str] = []
        for key in stores + unsure:
            keys.add(key)
            keys.update(key + suffix for suffix in _SIDECARS)
            keys.add(str(PurePosixPath(key).with_suffix(".jsonl")))  # where the store logs
            folder, name = posixpath.split(key)
            marker = posixpath.join(folder, _RUN_MARKER)
            if name == _RUN_STORE and key in sigs and marker in sigs:
                folders.append(folder + "/" if folder else "")
        log_probes: dict[str, tuple[_Sig, bool]] = {}
        for key in logs:
            sig = sigs[key]
            if key in keys or self._logs.get(key) == sig[2]:
                keys.add(key)
                continue
            seen = self._log_probes.get(key)
            if seen is None or seen[0] != sig:
                seen = (sig, _is_harness_log(os.path.join(self.root, key)))
            log_probes[key] = seen
            if seen[1]:
                keys.add(key)
                self._logs[key] = sig[2]
        self._log_probes = log_probes
        return _Owned(frozenset(keys), tuple(folders))

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
        sigs, owned = self._scan()
        self._refresh_cache(sigs)
        self._next += 1
        # Each window keeps the values it started from: the shared cache moves on with later
        # (nested) windows, but this window's "before" must not.
        values = {k: self._cache[k][1] for k in sigs}
        self._windows[self._next] = (time.time_ns(), sigs, values, owned)
        return self._next

    def changes(self, mark: int) -> dict[str, Any]:
        started, then, values, then_owned = self._windows.get(mark, (0, {}, {}, _NOTHING))
        now, owned = self._scan()
        out: dict[str, Any] = {}
        # Like git's "racily clean" entries: a file whose mtime is not clearly older than the
        # window may have been rewritten within one timestamp tick at the same size.
        racy = started - _TICK_NS
        for key in then.keys() | now.keys():
            old, new = then.get(key), now.get(key)
            if old == new and (new is None or new[0] < racy or key not in values):
                continue
            # A file the harness owned at either end (a store made or removed during the
            # window, a run folder's file written before its marker) is no change.
            if key in owned or key in then_owned:
                continue
            if old == new and self._read(self.root / key) == values[key]:
                continue
            out[key] = values.get(key)
        return out

    def release(self, mark: int) -> None:
        self._windows.pop(mark, None)

    def fingerprint(self) -> str:
        sigs, _ = self._scan()
        self._refresh_cache(sigs)
        return digest({k: self._cache[k][1] for k in sorted(sigs)})

    def to_dict(self) -> dict[str, Any]:
        """Every tracked file's current value."""
        sigs, _ = self._scan()
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

"""Writing a file the user named, or one in a run folder: safely, atomically, strict JSON.

Every file the harness writes for a person to read (exports, HTML reports, a run's summary and
evidence) goes through :func:`write_output`: the text is written to a temporary file in the
same folder and renamed over the target with ``os.replace``, so a reader never sees half a
file, and a target that is not a regular file (a symlink, a FIFO, a device, a folder) is
refused instead of being replaced or written through. JSON goes through :func:`json_text`,
which writes NaN and infinities as ``null``: strict JSON has no ``NaN``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import HarnessError

__all__ = ["finite", "json_text", "write_output"]


def finite(value: Any) -> Any:
    """``value`` with every NaN and infinity (in dicts, lists and tuples) as ``None``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def json_text(value: Any, *, indent: int | None = None) -> str:
    """``value`` as strict JSON: NaN and infinities become ``null``; other values JSON cannot
    hold are written as their text. ``allow_nan=False`` is the safety net."""
    return json.dumps(finite(value), indent=indent, default=str, allow_nan=False)


def _check_target(path: Path) -> None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise HarnessError(
            f"cannot write {path} ({exc.strerror or exc}); nothing was written"
        ) from exc
    if stat.S_ISLNK(st.st_mode):
        raise HarnessError(
            f"{path} is a symbolic link; nothing was written. Give the path of a regular file "
            "(or a new one)"
        )
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise HarnessError(
            f"{path} is {kind}; nothing was written. Give the path of a regular file (or a new one)"
        )


def write_output(path: str | Path, text: str | Iterable[str]) -> Path:
    """Write ``text`` (or its chunks, in order) to ``path`` atomically; returns the path.

    The folder is created when missing. The text goes to a temporary file beside ``path``,
    which then replaces it, so ``path`` holds the old file or the whole new one, never part.

    Raises:
        HarnessError: ``path`` exists and is not a regular file (or is a symbolic link), or
            its folder cannot be created or written; nothing is written and no temporary file
            is left. Also whatever producing the chunks raises (nothing is left then either).
    """
    target = Path(path)
    _check_target(target)
    folder = target.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise HarnessError(
            f"cannot write {target}: the folder {folder} cannot be created or written "
            f"({exc.strerror or exc}); nothing was written"
        ) from exc
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            if isinstance(text, str):
                fh.write(text)
            else:
                for chunk in text:
                    fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; an output is for others to read too
        _check_target(target)  # made a symlink or FIFO while we wrote: still refused
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise HarnessError(
            f"cannot write {target} ({exc.strerror or exc}); nothing was written"
        ) from exc
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return target

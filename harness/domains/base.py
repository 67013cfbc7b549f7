"""What built-in environments share: a folder of their own, closed once, as a context manager."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Self

__all__ = ["FolderEnvironment"]


class FolderEnvironment:
    """An environment living in a folder: a new temporary one (removed on :meth:`close`) or a
    given one (kept).

    Subclasses call :meth:`_open_folder` first in ``__init__`` and put what they must release
    in :meth:`_release`.
    """

    _temporary: Path | None = None
    _closed = False

    def _open_folder(self, folder: str | os.PathLike[str] | None, prefix: str) -> Path:
        """The environment's folder, made temporary when none is given."""
        self._closed = False
        if folder is None:
            self._temporary = Path(tempfile.mkdtemp(prefix=prefix))
            return self._temporary
        root = Path(folder)
        root.mkdir(parents=True, exist_ok=True)
        return root

    def _release(self) -> None:
        """Close what the environment holds open (connections), before its folder goes."""

    def close(self) -> None:
        """Release the environment and remove its folder if it made it; a second call is a no-op."""
        if self._closed:
            return
        self._closed = True
        try:
            self._release()
        finally:
            self._remove_folder()

    def _remove_folder(self) -> None:
        if self._temporary is not None:
            shutil.rmtree(self._temporary, ignore_errors=True)
            self._temporary = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _where(self) -> object:
        return self._temporary

    def __repr__(self) -> str:
        status = "closed" if self._closed else "open"
        return f"<{type(self).__name__} {self._where()} {status}>"

"""What built-in environments share: a folder of their own, closed once, as a context manager."""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import shutil
import tempfile
import threading
import weakref
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from pydantic import BaseModel

import harness as hx

__all__ = ["FolderEnvironment", "OccurrenceKeys", "delegate"]


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


class OccurrenceKeys:
    """Idempotency keys: the arguments' hash plus the occurrence number of that identical call.

    The engine's default key (name and arguments) answers a repeated identical call from its
    record without running the tool. Domains whose upstream runs it again (a second cancel is
    refused; "set to A, then B, then A" ends on A) number identical calls within one episode
    instead: a resumed episode that replays its calls from the start renumbers them the same
    way, so every committed call is still recognised and a call left in doubt matches its
    intent. Sound only for actions that are safe to run again after an unknown outcome.
    """

    def __init__(self) -> None:
        self._seen: weakref.WeakKeyDictionary[hx.Episode, Counter[str]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    def key(self, args: BaseModel) -> str:
        """The key of this call: ``<hash of the arguments>#<how many identical calls before>``."""
        text = json.dumps(
            args.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )
        ident = hashlib.sha256(text.encode()).hexdigest()[:32]
        episode = hx.current_episode()
        if episode is None:
            return f"{ident}#0"
        with self._lock:
            seen = self._seen.setdefault(episode, Counter())
            number = seen[ident]
            seen[ident] += 1
        return f"{ident}#{number}"


def delegate(tools: Any, name: str) -> Callable[..., Any]:
    """A function with the method's signature (without ``self``) and docstring that calls
    ``tools.<name>``, looked up at each call so patching the instance (a fault in a test)
    reaches the action built on it."""
    method = getattr(type(tools), name)

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(tools, name)(*args, **kwargs)

    functools.update_wrapper(call, method)  # name, docstring, annotations (and their module)
    call.__signature__ = _without_self(method)  # type: ignore[attr-defined]
    return call


@functools.lru_cache(maxsize=1024)
def _without_self(method: Callable[..., Any]) -> inspect.Signature:
    """The method's signature without ``self`` (once per method: every environment asks)."""
    signature = inspect.signature(method)
    return signature.replace(parameters=list(signature.parameters.values())[1:])

"""The JSON-lines log beside the database: structlog's sink and its timestamp processor."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any


class JsonLines:
    """structlog's sink for the JSON-lines log: whole lines, appended in batches.

    Lines are buffered and written with one ``write`` per batch of whole lines (so processes
    appending to the same file never split each other's lines), when the buffer passes 64 KiB,
    when a second has passed, and on :meth:`flush` (episodes flush when they end). The
    database is the durable record; these lines are for people and log shippers.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lines: list[str] = []
        self._size = 0
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def msg(self, message: str) -> None:
        """Queue one line."""
        with self._lock:
            self._lines.append(message + "\n")
            self._size += len(message) + 1
            if self._size > 65536 or time.monotonic() - self._last > 1.0:
                self._flush_locked()

    info = debug = warning = error = critical = exception = log = msg

    def _flush_locked(self) -> None:
        if self._lines:
            os.write(self._fd, "".join(self._lines).encode())
            self._lines.clear()
            self._size = 0
        self._last = time.monotonic()

    def flush(self) -> None:
        """Write every queued line."""
        with self._lock:
            self._flush_locked()

    def close(self) -> None:
        """Flush and close the file."""
        with self._lock:
            self._flush_locked()
            os.close(self._fd)


def _stamp(_logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Level and a Unix timestamp: a float is cheap to write and exact to read back."""
    event["level"] = method
    event["ts"] = time.time()
    return event

"""The JSON-lines log beside the database: structlog's sink and its timestamp processor."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import structlog

from .._json import dumps

KEEP = 1 << 20
"""Bytes of lines held while the file cannot be written (a full disk); older lines past it are
dropped, and counted."""


class JsonLines:
    """structlog's sink for the JSON-lines log: whole lines, appended in batches.

    Lines are buffered and written with one ``write`` per batch of whole lines (so processes
    appending to the same file never split each other's lines), when the buffer passes 64 KiB,
    when a second has passed, and on :meth:`flush` (episodes flush when they end). The
    database is the durable record; these lines are for people and log shippers: a write
    the file refuses (a full disk) never stops the harness. Its lines wait for the next flush
    (the newest :data:`KEEP` bytes of them; older ones are dropped, counted in
    :attr:`dropped`, and a ``jsonl_lines_dropped`` line says how many once writing works again).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lines: list[str] = []
        self._size = 0
        self._last = time.monotonic()
        self._lock = threading.Lock()
        self._unwritten = b""  # what a refused write left, written first next time
        self.dropped = 0
        self._told = 0  # (how many of the dropped lines a line has said)

    def msg(self, message: str) -> None:
        """Queue one line."""
        self.lines([message])

    info = debug = warning = error = critical = exception = log = msg

    def lines(self, messages: list[str]) -> None:
        """Queue lines, in order (written once 64 KiB are queued, or at the first call a second
        after the last write)."""
        with self._lock:
            self._lines.extend(m + "\n" for m in messages)
            self._size += sum(map(len, messages)) + len(messages)
            if self._size > 65536 or time.monotonic() - self._last > 1.0:
                self._flush_locked()

    def _flush_locked(self) -> None:
        self._last = time.monotonic()
        data = self._unwritten + "".join(self._lines).encode()
        self._lines.clear()
        self._size = 0
        data = self._write(data)
        if not data and self.dropped > self._told:  # (writing works again: say what is lost)
            note = {"event": "jsonl_lines_dropped", "count": self.dropped - self._told}
            self._told = self.dropped
            line = json.dumps(note | {"level": "warning", "ts": time.time()}) + "\n"
            data = self._write(line.encode())
        if len(data) > KEEP:
            cut = data.find(b"\n", len(data) - KEEP) + 1
            self.dropped += data[:cut].count(b"\n")
            data = data[cut:]
        self._unwritten = data

    def _write(self, data: bytes) -> bytes:
        """Write ``data``; return what the file refused (a full disk: the rest)."""
        try:
            while data:
                data = data[os.write(self._fd, data) :]
        except OSError:
            pass  # (the database is the record: a line the disk refuses never stops the harness)
        return data

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
    """Level and a Unix timestamp (when the line was queued, if it was): a float is cheap to
    write and exact to read back."""
    event["level"] = method
    if "ts" not in event:
        event["ts"] = time.time()
    return event


class EpisodeLog:
    """An episode's structlog logger, with the hot path's lines queued and sent in runs.

    ``later(event, **fields)`` queues an info line stamped with the time now. The queue goes
    out, in order, before any other call on this logger, when it holds :attr:`RUN` lines or
    its oldest is a second old, and on :meth:`drain` (the episode's end). A queued line goes
    through the logger's own processors to its sink, as ``info`` would send it, without the
    bound logger's per-call dispatch: sending lines in runs costs about half of sending each
    between two database writes. Like the sink's buffer, a queue a crash cuts short is lost;
    the database holds the record. Every other attribute is the bound logger's own.
    """

    __slots__ = ("_context", "_head", "_log", "_processors", "_queue", "_sink")
    RUN = 64

    def __init__(self, log: Any, processors: list[Any], sink: Any, *, stock: bool = False) -> None:
        self._log = log
        self._context = dict(structlog.get_context(log))
        self._processors = processors
        self._sink = sink
        self._queue: list[tuple[str, dict[str, Any]]] = []
        # ``stock``: the processors are the store's own (:func:`_stamp`, then structlog's
        # JSONRenderer with :func:`harness._json.dumps`), so a queued line is rendered here as
        # they would render it: the bound context's JSON once, each line's fields in one encode.
        self._head = dumps(self._context)[:-1] if stock else None

    def later(self, event: str, **fields: Any) -> None:
        """Queue one info line."""
        fields["ts"] = now = time.time()
        queue = self._queue
        queue.append((event, fields))
        if len(queue) >= self.RUN or now - queue[0][1]["ts"] > 1.0:
            self.drain()

    def drain(self) -> None:
        """Send the queued lines (as structlog's bound logger builds an event: its context,
        the fields, then the event name)."""
        queue, self._queue = self._queue, []
        if not queue:
            return
        context, processors, sink = self._context, self._processors, self._sink
        head = self._head
        if head is not None:
            # The line _stamp and the renderer make of {**context, **fields, "event": event}:
            # the context's keys, the fields' (a queued line has its ts), event, then level.
            # A field named like a context key (or event, level) takes the general path.
            comma = "," if context else ""
            lines = []
            for event, fields in queue:
                if "event" in fields or "level" in fields or not context.keys().isdisjoint(fields):
                    break
                lines.append(
                    f'{head}{comma}{dumps(fields)[1:-1]},"event":{dumps(event)},"level":"info"}}'
                )
            sink.lines(lines)
            queue = queue[len(lines) :]
        for event, fields in queue:
            line: Any = {**context, **fields, "event": event}
            for processor in processors:
                line = processor(sink, "info", line)
            sink.info(line)

    def __getattr__(self, name: str) -> Any:
        self.drain()
        return getattr(self._log, name)

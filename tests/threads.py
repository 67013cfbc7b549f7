"""Another thread holding a lock, for the tests of what waits for it and what does not."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def held_by_another_thread(lock: Any) -> Iterator[None]:
    """While the block runs, a thread of its own holds ``lock`` (a context manager); it lets
    go when the block ends."""
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(10), "the other thread did not get the lock"
        yield
    finally:
        release.set()
        holder.join(30)

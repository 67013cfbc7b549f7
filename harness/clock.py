"""Clocks: the engine reads time and sleeps only through one of these, so tests take no time."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "FakeClock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """What the engine needs from time: a monotonic reading and a way to wait."""

    def now(self) -> float:
        """Monotonic seconds."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block for ``seconds``."""
        ...

    async def asleep(self, seconds: float) -> None:
        """Wait ``seconds`` without blocking the event loop."""
        ...


class SystemClock:
    """The real clock: ``time.monotonic`` and real sleeps."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        await asyncio.sleep(max(seconds, 0.0))


class FakeClock:
    """A clock whose sleeps advance time instantly and are recorded in ``sleeps``.

    Tests use it (``harness.testing`` re-exports it), and so do fault trials on a fake clock.
    """

    def __init__(self, start: float = 0.0) -> None:
        self.t = start
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        """Move time forward (a slow tool calls this to look slow)."""
        self.t += seconds

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += max(seconds, 0.0)

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)

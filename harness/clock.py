"""Clocks: the engine reads time and sleeps only through one of these, so tests take no time."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "SystemClock"]


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

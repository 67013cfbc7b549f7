"""The episode's gate: calls of one episode made at once run one at a time.

Model APIs return several tool calls per turn, and frameworks run them at once: in threads
(LangGraph's ``ToolNode``, Pydantic AI) or as tasks (``asyncio.gather``). A transaction observes
the state between its mark and its commit and attributes every change in that window to its
call; two windows open at once would each see the other's writes. So each call holds the gate
from its first check to its outcome record, and the others wait: threads on a condition, tasks
on a future (the event loop keeps running). The holder itself passes through (a compensation
or a check calling an action); a task or thread a running tool started inherits the hold
(:meth:`Gate.inherited`), which the episode uses to run such a nested call as part of that call.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

from ..errors import ConfigurationError

__all__ = ["Gate"]

# The holds the current call chain has: (gate, the hold's number). A task or thread a tool
# starts inherits them; they pass only while that hold lasts (a background task that calls an
# action after the tool returned waits like any other call).
_HELD: contextvars.ContextVar[tuple[tuple[Gate, int], ...]] = contextvars.ContextVar(
    "harness_gates_held", default=()
)

Token = contextvars.Token[tuple[tuple["Gate", int], ...]]


class Gate:
    """A lock over one episode's calls, shared by threads and asyncio tasks."""

    __slots__ = ("_busy", "_cond", "_hold", "_holder", "_loop", "_sleepers", "_waiters")

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._busy = False
        self._hold = 0  # the number of the current (or last) hold
        self._holder: tuple[int, object] | None = None  # the thread and task that hold it
        self._sleepers = 0  # threads waiting on the condition
        self._loop: asyncio.AbstractEventLoop | None = None  # the holder's, when a task holds it
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def inherited(self) -> bool:
        """Whether this call chain descends from the current hold (the holder itself, or a
        task or thread started inside it with a copy of its context)."""
        for gate, hold in _HELD.get():
            if gate is self:
                return self._busy and hold == self._hold
        return False

    def holding(self) -> bool:
        """Whether the holder itself is asking (same thread and task): a call it makes while
        it holds the gate (a compensation's, a check's) passes through."""
        return self.inherited() and self._holder == _me()

    def _take(self) -> tuple[tuple[Gate, int], ...]:
        """Mark the gate taken (under the condition); the holds to set for this chain."""
        self._busy = True
        self._hold += 1
        self._holder = _me()
        held = _HELD.get()
        if not held:
            return ((self, self._hold),)
        return (*(h for h in held if h[0] is not self), (self, self._hold))

    def _release(self) -> None:
        with self._cond:
            self._busy = False
            self._loop = None
            self._holder = None
            if self._sleepers:
                self._cond.notify()
            waiters = self._waiters
            if waiters:
                self._waiters = []
        for loop, future in waiters:
            if not loop.is_closed():
                loop.call_soon_threadsafe(_wake, future)

    def enter(self) -> Token | None:
        """Take the gate in this thread, waiting for it; None when this call chain holds it
        already. Give what it returns to :meth:`exit`."""
        if _HELD.get() and self.holding():
            return None
        with self._cond:
            while self._busy:
                if self._loop is not None and self._loop is asyncio._get_running_loop():
                    # The holder is a task of the loop this thread runs: waiting here would
                    # stop that loop, and the holder with it.
                    raise ConfigurationError(
                        "a sync action was called from a coroutine while another call of the "
                        "same episode is running on this event loop; waiting would block the "
                        "loop for good. Make the action async def, or call it through "
                        "asyncio.to_thread(...)"
                    )
                self._sleepers += 1
                try:
                    self._cond.wait()
                finally:
                    self._sleepers -= 1
            holds = self._take()
        return _HELD.set(holds)

    def exit(self, token: Token | None) -> None:
        """Give back what :meth:`enter` took."""
        if token is not None:
            _HELD.reset(token)
            self._release()

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold the gate in this thread (blocking), unless this call chain holds it already."""
        token = self.enter()
        try:
            yield
        finally:
            self.exit(token)

    @asynccontextmanager
    async def aheld(self) -> AsyncIterator[None]:
        """Hold the gate in this task, waiting without blocking the event loop."""
        if self.holding():
            yield
            return
        loop = asyncio.get_running_loop()
        while True:
            with self._cond:
                if not self._busy:
                    holds = self._take()
                    self._loop = loop
                    break
                future: asyncio.Future[None] = loop.create_future()
                self._waiters.append((loop, future))
            await future
        token = _HELD.set(holds)
        try:
            yield
        finally:
            _HELD.reset(token)
            self._release()


def _me() -> tuple[int, object]:
    """This thread, and the asyncio task running in it (if any)."""
    loop = asyncio._get_running_loop()
    return threading.get_ident(), None if loop is None else asyncio.current_task(loop)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)

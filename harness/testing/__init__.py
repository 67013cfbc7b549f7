"""Fakes for tests: a clock that never sleeps and a tool that fails on schedule."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..clock import FakeClock
from ..errors import TransientError

__all__ = ["FakeClock", "Flaky"]


class Flaky:
    """Wrap ``fn`` so chosen calls raise before running it (or after: a lost acknowledgement).

    Args:
        fn: the function to wrap.
        fail_on: 1-based call numbers that fail.
        error: the exception factory (default :class:`TransientError`).
        after: fail after running ``fn``, so the effect happens but the caller sees an error.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        fail_on: Iterable[int],
        *,
        error: Callable[[], BaseException] = lambda: TransientError("injected"),
        after: bool = False,
    ) -> None:
        self.fn = fn
        self.fail_on = set(fail_on)
        self.error = error
        self.after = after
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        failing = self.calls in self.fail_on
        if failing and not self.after:
            raise self.error()
        result = self.fn(*args, **kwargs)
        if failing:
            raise self.error()
        return result

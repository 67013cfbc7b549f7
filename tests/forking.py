"""A process that dies with a change window open, for the tests of what it leaves behind."""

from __future__ import annotations

import os

import harness as hx


def die_with_a_window_open(url: str | os.PathLike[str]) -> None:
    """Fork a child that opens an adapter on ``url``, opens a window and exits without closing
    either (as a killed process would); wait for it and check it got that far."""
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            kept = hx.SQLState(url)
            kept.mark()
            code = 0
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0

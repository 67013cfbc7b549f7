"""State adapters: the harness's view of external state."""

from .base import Change, ScopeMatcher, StateAdapter, diff
from .dict import DictState
from .files import FileState
from .sql import PostgresState, SQLState

__all__ = [
    "Change",
    "DictState",
    "FileState",
    "PostgresState",
    "SQLState",
    "ScopeMatcher",
    "StateAdapter",
    "diff",
]

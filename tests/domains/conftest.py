"""Fixtures the domains' tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import harness as hx


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[hx.Store]:
    """One store for the many replay episodes (each has its own id); opening a store per
    episode would cost more than the episode."""
    store = hx.Store(f"sqlite:///{tmp_path_factory.mktemp('logs') / 'harness.db'}", create=True)
    yield store
    store.close()

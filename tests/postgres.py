"""Throwaway Postgres databases for the tests, on the server ``HX_TEST_POSTGRES_URL`` names."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

SERVER = os.environ.get("HX_TEST_POSTGRES_URL", "")


def libpq(url: str) -> str:
    """A SQLAlchemy URL (``postgresql+psycopg://...``) as libpq takes it."""
    return "postgresql://" + url.partition("://")[2]


@contextmanager
def fresh_database() -> Iterator[str]:
    """The SQLAlchemy URL of a new, empty database, dropped after; the test is skipped when
    no server is given."""
    if not SERVER:
        pytest.skip("set HX_TEST_POSTGRES_URL to run on Postgres")
    psycopg = pytest.importorskip("psycopg")
    name = f"hx_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(libpq(SERVER), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield SERVER.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(libpq(SERVER), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

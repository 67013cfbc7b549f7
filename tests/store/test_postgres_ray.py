"""A run on Ray writing one Postgres store, its trials acting on one Postgres state database.

Ray workers (several trials at once in each) run the trials of one run; every trial's
environment is a Postgres SQLState on one shared database (each trial's rows in a schema of its
own, so trials stay isolated while their adapters' capture triggers work side by side), and
every episode, lease and trial row goes to one Postgres store. Afterwards every chain verifies,
every trial is recorded once with its two cancels committed once, and nothing is left behind
(leases, trial schemas, capture tables).

Runs when ``HX_TEST_POSTGRES_URL`` names a server the tests may create databases on (see
test_postgres_many_writers, whose fixture and cancel action this reuses).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .test_postgres_many_writers import SERVER, _libpq, cancel_action, databases, psycopg

ray = pytest.importorskip("ray")

import harness as hx  # noqa: E402
from harness.runs.layout import run_row  # noqa: E402
from harness.runs.ray_pool import RayExecutor  # noqa: E402
from harness.runs.spec import Job, RunSpec  # noqa: E402
from harness.runs.start import trial_seed  # noqa: E402
from harness.runs.worker import TrialResult  # noqa: E402

pytestmark = pytest.mark.skipif(
    not SERVER,
    reason="set HX_TEST_POSTGRES_URL=postgresql+psycopg://user@host:port/db to run on Postgres",
)

__all__ = ["OrdersInASchema", "databases"]

TASKS, TRIALS = 4, 3


class OrdersInASchema:
    """One trial's environment: orders ``a`` and ``b`` (pending) in a schema of its own on the
    state database, a Postgres SQLState on it, and the many-writers test's cancel action."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.schema = f"trial_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(_libpq(url), autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {self.schema}")
            conn.execute(
                f"CREATE TABLE {self.schema}.orders (id text PRIMARY KEY, status text, items jsonb)"
            )
            conn.execute(
                f"INSERT INTO {self.schema}.orders VALUES "
                """('a', 'pending', '["a"]'), ('b', 'pending', '["a"]')"""
            )
        self.state = hx.SQLState(f"{url}?options=-csearch_path%3D{self.schema}")
        self.tools: dict[str, Any] = {"cancel": cancel_action(self.state)}

    def export(self) -> dict[str, Any]:
        rows = self.state.connection.execute("SELECT id, status FROM orders").fetchall()
        return {"orders": dict(rows)}

    def close(self) -> None:
        self.state.close()
        with psycopg.connect(_libpq(self.url), autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {self.schema} CASCADE")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A small local Ray instance for the module."""
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    try:
        yield
    finally:
        ray.shutdown()


def write_suite(folder: Path, state_url: str) -> Path:
    """TASKS tasks, each cancelling orders a and b of its trial's schema."""
    folder.mkdir(parents=True)
    tasks = [
        {
            "id": f"t{i}",
            "version": "1",
            "instruction": "cancel orders a and b",
            "reference_actions": [
                {"name": "cancel", "arguments": {"order_id": "a"}},
                {"name": "cancel", "arguments": {"order_id": "b"}},
            ],
        }
        for i in range(TASKS)
    ]
    (folder / "suite.json").write_text(
        json.dumps(
            {
                "name": "orders",
                "version": "1",
                "environment": f"{__name__}:OrdersInASchema",
                "environment_options": {"url": state_url},
                "tasks": ["tasks.json"],
            }
        )
    )
    (folder / "tasks.json").write_text(
        json.dumps({"format": "harness.tasks", "version": 1, "tasks": tasks})
    )
    return folder


def test_ray_workers_write_one_postgres_run_and_every_chain_verifies(
    local_ray: None, databases: tuple[str, str], tmp_path: Path
):
    """Three Ray workers, two trials at once in each, run twelve trials on one Postgres store
    and one Postgres state database: every trial passes and is recorded once, each of its
    cancels committed once, no lease or trial schema is left, and every chain verifies."""
    state_url, store_url = databases
    suite = write_suite(tmp_path / "suite", state_url)
    store = hx.Store(store_url, create=True)
    store.add(run_row("r", suite="orders", status="running", config="{}", evidence="{}"))
    jobs = [Job(f"t{t}", i, trial_seed(0, f"t{t}", i)) for i in range(TRIALS) for t in range(TASKS)]
    got: list[TrialResult] = []
    try:
        spec = RunSpec(str(suite), "scripted", store_url, "r", hx.Policy())
        RayExecutor(spec, workers=3, concurrency=2).run(
            jobs,
            on_result=lambda _job, r: got.append(r) if r is not None else None,
        )
        expected = sorted(f"r-t{t}-{i}" for t in range(TASKS) for i in range(TRIALS))
        assert sorted(r.episode_id for r in got) == expected
        assert all(r.passed for r in got), [r for r in got if not r.passed]
        assert sorted(r.episode_id for r in store.trial_rows("r")) == expected
        for eid in expected:
            txns = store.transactions(eid)
            assert [(t.idem_key, t.status) for t in txns] == [
                ("cancel:a", "committed"),
                ("cancel:b", "committed"),
            ], eid
        assert store.leases() == []
        assert store.escalations() == []
        report = store.verify()
        assert report.ok and not report.findings, report.findings
    finally:
        store.close()
    with psycopg.connect(_libpq(state_url), autocommit=True) as conn:
        schemas = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'trial\\_%'"
        ).fetchone()
        leftovers = conn.execute(
            "SELECT count(*) FROM pg_class WHERE relname LIKE '\\_hx\\_%'"
        ).fetchone()
    assert schemas == (0,) and leftovers == (0,)

"""Run-wide limits kept in a Postgres store: two worker processes of a run whose store is a
Postgres database share its limits on requests in flight and requests started per second
(skipped unless HX_TEST_POSTGRES_URL names a server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.suite import Suite
from harness.testing.model_server import FakeChatServer, ReplayPolicy

from ..postgres import fresh_database
from .test_run_limits import most_in_window, two_processes

pytestmark = pytest.mark.usefixtures("fresh_endpoints")


def test_limits_hold_over_two_processes_on_a_postgres_store(toy: Suite, tmp_path: Path) -> None:
    """At most three requests at once and twenty started in any second, over both processes
    (a second at the server may also hold arrivals started before it, at most the three in
    flight: the bound holds however long the way there takes)."""
    with fresh_database() as url, FakeChatServer(ReplayPolicy(toy.tasks), latency=0.02) as server:
        two_processes(toy, server, tmp_path, store=url, max_in_flight=3, rate_limit="20/s")
    assert 2 <= server.peak_in_flight <= 3
    assert most_in_window(server.arrived, 1.0) <= 20 + 3

"""Run-wide limits hold across Ray actors: two actors of four trials in flight each send at
most two requests at once to the model server."""

from __future__ import annotations

from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from harness.runs.start import run_trials  # noqa: E402
from harness.suite import Suite  # noqa: E402
from harness.testing.model_server import FakeChatServer, ReplayPolicy  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_endpoints")


def test_max_in_flight_holds_across_ray_actors(cluster: str, toy: Suite, tmp_path: Path) -> None:
    """Every trial passes, and the server never answers more than two requests at once."""
    with FakeChatServer(ReplayPolicy(toy.tasks), latency=0.05) as server:
        result = run_trials(
            toy,
            agent="openai",
            agent_options={"base_url": server.base_url, "model": "fake"},
            workers=2,
            concurrency=4,
            executor="ray",
            address=cluster,
            logs=tmp_path,
            max_in_flight=2,
        )
    assert result.stopped is None and all(r.passed for r in result.results)
    assert len(result.results) == 6
    assert server.peak_in_flight == 2

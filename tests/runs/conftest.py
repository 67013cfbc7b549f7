"""A finished run the tests of reading runs back share."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.agents.endpoint import forget_endpoints
from harness.runs.start import run_trials
from harness.suite import Suite, load_suite

from ..toy_env import write_suite


@pytest.fixture(scope="module")
def good_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run of the toy suite: 2 tasks, 2 trials."""
    base = tmp_path_factory.mktemp("good")
    suite = write_suite(base / "suite", [1, 2])
    result = run_trials(
        suite, agent="simulated", trials=2, seed=3, logs=base / "logs", run_id="good"
    )
    return result.folder


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Suite:
    """Six tasks of one to three writes each."""
    return load_suite(write_suite(tmp_path_factory.mktemp("toy") / "suite", [1, 2, 3, 1, 2, 3]))


@pytest.fixture
def fresh_endpoints() -> Iterator[None]:
    """No endpoint state before or after the test, as in a new process."""
    forget_endpoints()
    yield
    forget_endpoints()


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A local Ray instance for the module (two CPUs, no dashboard); its address."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()

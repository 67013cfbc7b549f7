"""A finished run the tests of reading runs back share."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.runs.start import run_trials

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

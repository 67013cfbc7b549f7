"""A conversation cut short earns nothing, whatever state it left (tau2's rule)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.agents import OpenAIAgent, ScriptedUser
from harness.runs.judge import premature_end
from harness.runs.start import run_trials
from harness.suite import load_suite
from harness.testing.model_server import FakeChatServer, ReplayPolicy

TAU2_TASKS = Path(__file__).resolve().parents[3] / "shared" / "data" / "tau2-retail" / "tasks.json"


def test_only_a_user_or_agent_stop_is_rewarded():
    assert premature_end({"termination_reason": "user_stop"}) is None
    assert premature_end({"termination_reason": "agent_stop"}) is None
    assert premature_end({}) is None and premature_end(None) is None  # no conversation
    assert premature_end({"termination_reason": "max_steps"}) == "max_steps"
    assert premature_end({"termination_reason": "too_many_errors"}) == "too_many_errors"


def test_a_conversation_cut_by_max_steps_fails_though_the_state_is_right(tmp_path: Path):
    """The same replayed conversation passes when the user ends it, and fails when the step
    cap ends it at the user's last message, with the database just as right."""
    if not TAU2_TASKS.exists():
        pytest.skip(f"reference data absent: {TAU2_TASKS.name}")
    suite = load_suite(TAU2_TASKS)
    task = next(t for t in suite.tasks if t.reference_actions)

    def run(run_id: str, **caps: int) -> tuple[bool, dict[str, int], str]:
        with FakeChatServer(ReplayPolicy(task)) as server:
            agent = OpenAIAgent(base_url=server.base_url, model="fake", user=ScriptedUser(), **caps)
            result = run_trials(
                suite, agent=agent, trials=1, tasks=[task.id], logs=tmp_path, run_id=run_id
            )
        (trial,) = result.results
        return trial.passed, trial.failures, result.folder

    passed, failures, _ = run("whole")
    assert passed and not any(k.startswith("ended:") for k in failures)
    steps = whole_steps(tmp_path / "whole", task.id)
    passed, failures, _ = run("cut", max_steps=steps)
    assert not passed
    assert failures.get("ended: max_steps") == 1
    assert whole_state(tmp_path / "whole") == whole_state(tmp_path / "cut")


def whole_steps(folder: Path, task_id: str) -> int:
    """The steps of the recorded conversation (its agent meta)."""
    import harness as hx

    store = hx.Store(f"sqlite:///{folder / 'harness.db'}")
    try:
        (trial,) = store.trials()
        return int(trial.agent_meta["steps"])
    finally:
        store.close()


def whole_state(folder: Path) -> list[tuple[str, object]]:
    """Every committed change of the run, by action and diff."""
    import harness as hx

    store = hx.Store(f"sqlite:///{folder / 'harness.db'}")
    try:
        (trial,) = store.trials()
        return [(t.action, t.diff) for t in store.transactions(trial.episode_id)]
    finally:
        store.close()

"""The example suite and agent in examples/ run as the documentation says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import harness as hx
from harness.cli import main

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
DESK = f"{EXAMPLES / 'agents' / 'desk_agent.py'}:DeskAgent"


@pytest.mark.parametrize("agent", ["scripted", DESK])
def test_example_suite_passes_with_the_scripted_and_the_example_agent(tmp_path: Path, agent: str):
    """examples/tickets passes every trial with the scripted agent and with the rule-based
    example agent, whose refusals come from the tools' preconditions."""
    result = hx.run_trials(EXAMPLES / "tickets", agent=agent, trials=2, logs=tmp_path)
    assert len(result.results) == 8 and all(r.passed for r in result.results)
    if agent == DESK:
        assert result.failures_by_class() == {"precondition": 2}


def test_example_agent_from_the_command_line_with_its_options_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """`harness run examples/tickets --agent desk_agent:DeskAgent` from examples/agents runs
    the example agent; its options reach it and the evidence records them."""
    monkeypatch.chdir(EXAMPLES / "agents")
    args = ["run", str(EXAMPLES / "tickets"), "--agent", "desk_agent:DeskAgent"]
    out = CliRunner().invoke(main, [*args, "--trials", "1", "--logs", str(tmp_path)])
    assert out.exit_code == 0, out.output
    (run,) = tmp_path.iterdir()
    assert json.loads((run / "evidence.json").read_text())["agent"] == {
        "name": "desk",
        "polite": False,
    }
    polite = hx.run_trials(
        EXAMPLES / "tickets",
        agent="desk_agent:DeskAgent",
        agent_options={"polite": True},
        logs=tmp_path,
        run_id="polite",
    )
    assert all(r.passed for r in polite.results)
    store = hx.Store(polite.folder / "harness.db", readonly=True)
    assert all(t.message.startswith("Hello! ") for t in store.trials("polite"))
    store.close()

"""Resume and replay of a run whose agent the user named (`module:Class`, `file.py:Class`):
the run folder's record of the agent is built only when the user names or trusts it."""

from __future__ import annotations

import json
import sqlite3
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

import harness as hx
from harness.cli import main

from ..toy_env import write_suite

AGENT = """
from harness.agents import AgentOutput


class Steady:
    name = "steady"

    def config(self):
        return {"name": self.name}

    def run(self, task, toolbox, *, seed):
        for call in task.reference_actions:
            toolbox.call(call.name, dict(call.arguments))
        return AgentOutput(message="done")


class Other(Steady):
    name = "other"
"""


@pytest.fixture
def run_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A finished run of the toy suite by the agent `agents/steady.py:Steady` (1 task, 2
    trials)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "steady.py").write_text(textwrap.dedent(AGENT))
    suite = write_suite(tmp_path / "suite", [2])
    hx.run_trials(
        suite, agent="agents/steady.py:Steady", trials=2, logs=tmp_path / "logs", run_id="r1"
    )
    return tmp_path / "logs" / "r1"


def run_record(folder: Path) -> tuple[object, ...]:
    """What a resume writes: the run's row (its status and evidence, with every resume), its
    trial rows and log records, and the evidence file."""
    with sqlite3.connect(f"file:{folder / 'harness.db'}?mode=ro", uri=True) as conn:
        run = conn.execute("SELECT status, config, evidence FROM hx_run").fetchall()
        trials = conn.execute("SELECT count(*) FROM hx_trial").fetchone()
        log = conn.execute("SELECT count(*) FROM hx_log").fetchone()
    conn.close()
    return run, trials, log, (folder / "evidence.json").read_bytes()


def invoke(*args: str) -> tuple[int, str]:
    """Run the command line; its exit code and its output on one line."""
    out = CliRunner().invoke(main, list(args))
    return out.exit_code, " ".join(out.output.split())


def test_resume_builds_a_recorded_spec_only_when_named_or_trusted(run_folder: Path):
    """`harness resume` of a run by a user's agent is refused without --agent or --trust-agent
    (the message names both, and nothing is written); with either, it is resumed."""
    before = run_record(run_folder)
    code, said = invoke("resume", str(run_folder), "--trust-suite")
    assert code == 2 and "--trust-agent" in said
    assert f"--agent {run_folder.parents[1] / 'agents' / 'steady.py'}:Steady" in said
    assert run_record(run_folder) == before
    with pytest.raises(hx.ConfigurationError, match="not a built-in agent"):
        hx.resume_run(run_folder, trust=True)
    code, said = invoke(
        "resume", str(run_folder), "--trust-suite", "--agent", "agents/steady.py:Steady"
    )
    assert code == 0 and "kept 2, resumed 0, ran 0 missing" in said, said
    code, said = invoke("resume", str(run_folder), "--trust-suite", "--trust-agent")
    assert code == 0 and "kept 2, resumed 0, ran 0 missing" in said, said


def test_a_run_folder_naming_other_code_imports_nothing_without_trust(run_folder: Path):
    """A run folder whose recorded agent was edited to another file is refused by resume and
    replay: that file is never imported."""
    marker = run_folder.parent / "imported"
    evil = run_folder.parent / "evil.py"
    evil.write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    with sqlite3.connect(run_folder / "harness.db") as conn:
        conn.execute("UPDATE hx_run SET config = json_set(config, '$.agent', ?)", (f"{evil}:A",))
    conn.close()
    # The edit is found first: every trial's start record binds the run's configuration.
    code, said = invoke("resume", str(run_folder), "--trust-suite")
    assert code == 2 and "fails verification" in said and "configuration" in said, said
    assert not marker.exists()
    # Told to go on unverified, the recorded code is still not imported on the folder's word.
    code, said = invoke("resume", str(run_folder), "--trust-suite", "--allow-unverified")
    assert code == 2 and "a run folder does not choose the code that runs" in said
    code, said = invoke(
        "replay", str(run_folder), "--episode", "r1-t0-0", "--trust-suite", "--allow-unverified"
    )
    assert code == 2 and "--trust-agent" in said
    assert not marker.exists()


def test_the_named_agent_must_be_the_runs_agent(run_folder: Path):
    """An agent named on resume that builds another agent than the run's is refused, naming
    both."""
    code, said = invoke(
        "resume", str(run_folder), "--trust-suite", "--agent", "agents/steady.py:Other"
    )
    assert code == 2 and "made by agent 'steady'" in said and "builds agent 'other'" in said
    code, said = invoke("resume", str(run_folder), "--trust-suite", "--agent", "scripted")
    assert code == 2 and "builds agent 'scripted'" in said


def test_replay_of_a_users_agent_from_the_command_line(run_folder: Path):
    """`harness replay --agent file.py:Class` (or --trust-agent) re-runs the user's agent
    against the record with no divergence."""
    for flags in (["--agent", "agents/steady.py:Steady"], ["--trust-agent"]):
        code, said = invoke(
            "replay", str(run_folder), "--episode", "r1-t0-0", "--trust-suite", *flags, "--json"
        )
        assert code == 0, said
        report = json.loads(said)
        assert report["divergence"] is None and report["replayed"] == report["steps"] == 3


def test_a_run_by_an_agent_object_says_how_to_resume_it(tmp_path: Path):
    """A run given an agent object records that it was one; resuming it from the command line
    says to name the agent's class or pass agent= from Python, which works."""
    from harness.agents import ScriptedAgent

    class Mine(ScriptedAgent):
        name = "mine"

    suite = write_suite(tmp_path / "suite", [1])
    hx.run_trials(suite, agent=Mine(), trials=1, logs=tmp_path / "logs", run_id="r1")
    folder = tmp_path / "logs" / "r1"
    code, said = invoke("resume", str(folder), "--trust-suite")
    assert code == 2 and "an object given in Python" in said
    assert "--agent module:Class" in said and "resume_run(folder, agent=...)" in said
    result = hx.resume_run(folder, agent=Mine(), trust=True)
    assert result.kept == ["r1-t0-0"]

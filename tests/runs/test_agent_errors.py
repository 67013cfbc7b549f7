"""An agent that raises fails its trial as the agent's error; the run goes on (through the CLI,
as a user meets it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import harness as hx
from harness.cli import main
from harness.runs import resume_run, run_trials

from ..toy_env import write_suite

AGENT = str(Path(__file__).with_name("raising_agent.py"))


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def folder_of(output: str) -> Path:
    (line,) = [ln for ln in output.splitlines() if ln.startswith("run folder: ")]
    return Path(line.removeprefix("run folder: "))


@pytest.mark.parametrize(
    ("cls", "name"), [("RaisingAgent", "ValueError"), ("ExitingAgent", "SystemExit")]
)
def test_an_agent_that_raises_fails_its_trials_and_the_run_goes_on(
    tmp_path: Path, cls: str, name: str
):
    """Every trial of task t1 raises (ValueError, or SystemExit(7)): each ends as a failed
    trial with the agent's error and its traceback on record, counted by class as the agent's
    failure (never infrastructure); every other trial runs; the run is finished, verifies, and
    a resume has nothing to do."""
    suite = write_suite(tmp_path / "suite", [1, 1, 2])
    agent = f"{AGENT}:{cls}"
    code, out = run_cli(
        *("run", str(suite), "--agent", agent, "--trials", "3", "--logs", str(tmp_path))
    )
    assert code == 0, out
    assert "3 trial(s) ended in an agent error" in out and name in out
    folder = folder_of(out)
    store = hx.Store(folder / "harness.db")
    rows = store.trial_rows()
    assert len(rows) == 9
    raised = [r for r in rows if r.task_id == "t1"]
    assert all(not r.passed and not r.infra_error for r in raised)
    for row in raised:
        meta = json.loads(row.agent_meta)
        assert meta["agent_error"].startswith(name)
        assert "Traceback" in meta["traceback"] and "raising_agent.py" in meta["traceback"]
        assert json.loads(row.failures)["agent error"] == 1
    assert all(r.passed for r in rows if r.task_id != "t1")
    assert store.runs()[0].status == "finished"
    # The write the agent made before raising was undone with the rest of its episode.
    assert {store.episode(r.episode_id).status for r in raised} <= {"rolled_back", "failed"}
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["failures_by_class"]["agent error"] == 3
    assert summary["agent_errors"] == 3
    assert store.verify().ok
    store.close()
    code, out = run_cli("verify", str(folder))
    assert code == 0, out
    code, out = run_cli("resume", str(folder), "--suite", str(suite), "--agent", agent, "--json")
    assert code == 0, out
    assert json.loads(out)["started"] == [] and len(json.loads(out)["kept"]) == 9


def test_too_many_agent_errors_stop_the_run_and_resume_finishes_it(tmp_path: Path):
    """With --max-agent-errors 1, the second trial whose agent raises stops the run (exit 3,
    saying why): the trials in flight end, no new one starts, the run is interrupted. Once the
    bug is fixed, resume runs every trial left, once."""
    suite = write_suite(tmp_path / "suite", [1, 1])
    fixed = tmp_path / "fixed"
    agent = "tests.runs.raising_agent:RaisingAgent"
    result = run_trials(
        suite,
        agent=agent,
        agent_options={"task": "t0", "fixed": str(fixed)},
        trials=5,
        logs=tmp_path,
        max_agent_errors=1,
    )
    assert result.interrupted and result.stopped is not None
    assert "--max-agent-errors" in result.stopped and "ValueError" in result.stopped
    assert len(result.agent_errors()) == 2
    assert 0 < result.missing < 10
    store = hx.Store(result.folder / "harness.db")
    assert store.runs()[0].status == "interrupted"
    store.close()
    fixed.touch()
    resumed = resume_run(result.folder, agent=agent, suite=suite)
    assert resumed.complete
    assert len(resumed.run.results) == 10
    assert len(resumed.started) == result.missing
    store = hx.Store(result.folder / "harness.db")
    assert len(store.trial_rows()) == 10 and store.runs()[0].status == "finished"
    assert store.verify().ok
    store.close()


def test_the_agent_error_limit_is_checked(tmp_path: Path):
    """A negative limit, or a fraction of 1 or more, is refused with the fix; on the CLI a
    count or a fraction (0.2, 20%)."""
    suite = write_suite(tmp_path / "suite", [1])
    with pytest.raises(hx.ConfigurationError, match="count >= 0 or a fraction"):
        run_trials(suite, max_agent_errors=-1, logs=tmp_path)
    with pytest.raises(hx.ConfigurationError, match="count >= 0 or a fraction"):
        run_trials(suite, max_agent_errors=1.5, logs=tmp_path)
    assert not list(tmp_path.glob("2*"))  # (nothing was made)
    code, out = run_cli("run", str(suite), "--max-agent-errors", "lots", "--logs", str(tmp_path))
    assert code == 2 and "a count of trials (5) or a fraction" in out


def test_an_agent_interrupted_stops_the_run_as_ctrl_c_does(tmp_path: Path):
    """KeyboardInterrupt out of the agent is a stop, not the agent's failure: the run is
    interrupted (exit 130), the trial it was in has no row, and resume finishes the run."""
    suite = write_suite(tmp_path / "suite", [1, 1])
    agent = "tests.runs.raising_agent:RaisingAgent"
    fixed = tmp_path / "fixed"
    options = {"task": "t1", "raise_as": "interrupt", "fixed": str(fixed)}
    result = run_trials(suite, agent=agent, agent_options=options, trials=2, logs=tmp_path)
    assert result.interrupted and result.stopped is None
    assert [r.task_id for r in result.results] == ["t0"]
    fixed.touch()
    resumed = resume_run(result.folder, agent=agent, suite=suite)
    assert resumed.complete and len(resumed.run.results) == 4
    assert len(resumed.resumed) == 1  # (the interrupted trial's episode, continued)
    store = hx.Store(result.folder / "harness.db")
    assert store.verify().ok
    store.close()


def test_agent_error_limits_judge_counts_and_fractions_exactly():
    """A count is past when more trials raised; a fraction when more than that share of the
    trials finished raised (29 of 100 is not past 29%), after ten; NaN is refused."""
    from harness.runs.lifecycle import AgentErrorLimit

    assert not AgentErrorLimit(2).exceeded(2, 3) and AgentErrorLimit(2).exceeded(3, 3)
    assert not AgentErrorLimit(0.29).exceeded(29, 100)
    assert AgentErrorLimit(0.29).exceeded(30, 100)
    assert not AgentErrorLimit(0.1).exceeded(5, 9)  # (fewer than ten finished)
    with pytest.raises(hx.ConfigurationError):
        AgentErrorLimit(float("nan"))
    code, out = run_cli("run", "retail", "--max-agent-errors", "nan")
    assert code == 2 and "a count >= 0" in out


def test_errors_a_worker_process_sends_arrive_whole():
    """A store refusing a write in a worker process reaches the run as itself (it pickles and
    unpickles); an error that cannot becomes its nearest harness class, message kept."""
    import pickle

    from harness.runs.executors import portable

    refused = hx.StoreWriteFailed("db", "the disk is full", "free space", OSError("full"))
    back = pickle.loads(pickle.dumps(portable(refused)))
    assert isinstance(back, hx.StoreWriteFailed) and back.cause == "the disk is full"

    class Odd(hx.StoreError):
        def __init__(self, a: str, b: str) -> None:
            super().__init__(f"{a} {b}")

    copy = portable(Odd("x", "y"))
    assert type(copy) is hx.StoreError and str(copy) == "x y"

"""``harness new-suite``: a skeleton that runs as it is, and one's own suite and agent taken
through a run, a crash, a resume and a report from the command line."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

import harness as hx
from harness.cli import main

# The console script, as a user runs it: unlike `python -m`, it does not put the current
# directory on sys.path, so finding `module:Class` there is the harness's doing.
HARNESS = shutil.which("harness", path=str(Path(sys.executable).parent)) or "harness"


def invoke(*args: str) -> tuple[int, str]:
    """Run the command line in this process; its exit code and its output on one line."""
    out = CliRunner().invoke(main, list(args))
    return out.exit_code, " ".join(out.output.split())


def test_new_suite_writes_a_skeleton_that_passes_as_it_is(tmp_path: Path):
    """The skeleton (manifest, two tasks, an environment module in the suite's folder with an
    action that has a precondition, a postcondition and a compensation, a README) loads and
    passes every trial with the scripted agent."""
    code, said = invoke("new-suite", "deliveries", "--dir", str(tmp_path / "suites"))
    assert code == 0, said
    folder = tmp_path / "suites" / "deliveries"
    assert sorted(p.name for p in folder.iterdir()) == [
        "README.md",
        "environment.py",
        "suite.json",
        "tasks.json",
    ]
    assert (
        "harness run deliveries --agent scripted --trials 1" in (folder / "README.md").read_text()
    )
    suite = hx.load_suite(folder)
    assert suite.name == "deliveries" and len(suite.tasks) == 2
    env = suite.new_environment()
    action = env.tools["receive_delivery"]
    assert isinstance(action, hx.Action)
    assert action.preconditions and action.postconditions and action.compensate is not None
    env.close()
    code, said = invoke(
        "run", str(folder), "--agent", "scripted", "--trials", "1", "--logs", str(tmp_path / "l")
    )
    assert code == 0, said
    (run,) = (tmp_path / "l").iterdir()
    store = hx.Store(run / "harness.db")
    assert [t.passed for t in store.trials(run.name)] == [True, True]
    store.close()


def test_new_suite_refuses_an_existing_folder_and_a_bad_name(tmp_path: Path):
    """An existing folder (even empty) is never written into, and a name that is not a plain
    folder name is refused; each error says what to do."""
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("keep")
    code, said = invoke("new-suite", "taken", "--dir", str(tmp_path))
    assert code == 2 and "exists; new-suite never overwrites" in said
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["mine.txt"]
    (tmp_path / "empty").mkdir()
    code, said = invoke("new-suite", "empty", "--dir", str(tmp_path))
    assert code == 2 and list((tmp_path / "empty").iterdir()) == []
    for bad in ("../up", "a/b", ".hidden", ""):
        code, said = invoke("new-suite", bad, "--dir", str(tmp_path))
        assert code == 2 and "is not a suite name" in said, (bad, said)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "taken"]


# --------------------------------------------------------------------------------------------
# One's own suite and agent, from new-suite to a report, through a crash.
# --------------------------------------------------------------------------------------------

AGENT = """
import os
import pathlib
import time

from harness.agents import AgentOutput


class CarefulAgent:
    \"\"\"Makes the task's calls in order; in an episode whose id ends as the PAUSE file
    says, it pauses after its first write until it is killed.\"\"\"

    name = "careful"

    def config(self):
        return {"name": self.name}

    def run(self, task, toolbox, *, seed):
        pause = pathlib.Path(os.environ["PAUSE"])
        writes = 0
        for call in task.reference_actions:
            toolbox.call(call.name, dict(call.arguments))
            writes += toolbox.is_write(call.name)
            here = toolbox.episode.id
            if writes == 1 and pause.exists() and here.endswith(pause.read_text()):
                pathlib.Path(f"{pause}.reached").write_text("yes")
                time.sleep(120)
        return AgentOutput(message="Done: the deliveries are in the stock.")
"""

LEDGER = """
import os


def ledger(line: str) -> None:
    \"\"\"One line per execution of a write, in a file every process shares.\"\"\"
    ep = hx.current_episode()
    fd = os.open(os.environ["LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, f"{ep.id if ep else ''}\\t{line}\\n".encode())
    os.close(fd)
"""

EXTRA_TASKS = [
    {
        "id": "two-apple-deliveries",
        "version": "1",
        "instruction": "Deliveries d-101 (2 apples) and d-102 (1 apple) arrived; stock them.",
        "reference_actions": [
            {"name": "get_item", "arguments": {"item": "apple"}},
            {
                "name": "receive_delivery",
                "arguments": {"delivery_id": "d-101", "item": "apple", "amount": 2},
            },
            {
                "name": "receive_delivery",
                "arguments": {"delivery_id": "d-102", "item": "apple", "amount": 1},
            },
        ],
        "checks": [{"key": "items/apple", "path": ["stock"], "equals": 8}],
    },
    {
        "id": "pear-and-apple",
        "version": "1",
        "instruction": "Stock delivery d-201 (5 pears), then delivery d-103 (4 apples).",
        "reference_actions": [
            {
                "name": "receive_delivery",
                "arguments": {"delivery_id": "d-201", "item": "pear", "amount": 5},
            },
            {
                "name": "receive_delivery",
                "arguments": {"delivery_id": "d-103", "item": "apple", "amount": 4},
            },
        ],
    },
]


def own_suite(tmp_path: Path) -> Path:
    """`harness new-suite deliveries`, two tasks added, its write logged to a ledger, and the
    agent `careful_agent:CarefulAgent` beside it; the suite's folder."""
    code, said = invoke("new-suite", "deliveries", "--dir", str(tmp_path))
    assert code == 0, said
    folder = tmp_path / "deliveries"
    tasks = json.loads((folder / "tasks.json").read_text())
    tasks["tasks"] += EXTRA_TASKS
    (folder / "tasks.json").write_text(json.dumps(tasks, indent=2))
    env = (folder / "environment.py").read_text()
    effect = '            state[f"items/{item}"] = record\n'
    assert env.count(effect) == 1, "the skeleton's action changed: update this test"
    env = env.replace(effect, effect + '            ledger(f"{delivery_id}")\n')
    env = env.replace("\n\nSTOCK =", "\n" + textwrap.dedent(LEDGER) + "\n\nSTOCK =")
    (folder / "environment.py").write_text(env)
    (tmp_path / "careful_agent.py").write_text(textwrap.dedent(AGENT))
    return folder


def harness_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the `harness` console script in ``tmp_path`` to its end."""
    return subprocess.run(
        [HARNESS, *args],
        cwd=tmp_path,
        env=os.environ | {"LEDGER": str(tmp_path / "ledger"), "PAUSE": str(tmp_path / "pause")},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_own_suite_and_agent_survive_a_kill_and_resume_from_the_command_line(tmp_path: Path):
    """A suite made with `harness new-suite` plus two tasks, run by a custom agent named
    `module:Class` and killed (SIGKILL) mid-episode once trials are recorded, is finished by
    `harness resume` and reported by `harness report`: every trial is recorded once and
    passes, every write ran exactly once, and the store verifies."""
    suite = own_suite(tmp_path)
    pause = tmp_path / "pause"
    # Trials run round by round (every task's trial 0, then trial 1...): the pause is in the
    # second round, in a task with two writes, after its first write committed.
    pause.write_text("-two-apple-deliveries-1")
    trials, writes_per_task = 3, [1, 1, 2, 2]
    child = subprocess.Popen(
        [HARNESS, "run", "deliveries", "--agent", "careful_agent:CarefulAgent", "--trials", "3"],
        cwd=tmp_path,
        env=os.environ | {"LEDGER": str(tmp_path / "ledger"), "PAUSE": str(pause)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        reached = Path(f"{pause}.reached")
        while not reached.exists():
            assert child.poll() is None, child.stderr.read() if child.stderr else ""
            assert time.monotonic() < deadline, "the run never reached the pause"
            time.sleep(0.01)
        os.killpg(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
        child.wait(30)
    pause.unlink()
    (folder,) = (tmp_path / "logs").iterdir()
    run_id = folder.name
    store = hx.Store(folder / "harness.db", readonly=True)
    recorded_before = {t.episode_id for t in store.trials(run_id)}
    store.close()
    assert 0 < len(recorded_before) < trials * len(writes_per_task)
    killed = f"{run_id}-two-apple-deliveries-1"
    assert killed not in recorded_before

    # The run folder alone does not choose the agent's code: named here, it resumes.
    refused = harness_cli(tmp_path, "resume", str(folder), "--suite", str(suite))
    assert refused.returncode == 2 and "--trust-agent" in refused.stderr
    resumed = harness_cli(
        tmp_path,
        *("resume", str(folder), "--suite", "deliveries"),
        *("--agent", "careful_agent:CarefulAgent", "--json"),
    )
    assert resumed.returncode == 0, resumed.stderr
    did = json.loads(resumed.stdout)
    assert did["resumed"] == [killed]
    assert set(did["kept"]) == recorded_before
    assert len(did["kept"]) + len(did["started"]) + 1 == trials * len(writes_per_task)

    report = harness_cli(tmp_path, "report", str(folder), "--json")
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    assert data["trials"] == trials * len(writes_per_task) and data["n"] == trials
    assert [e["value"] for e in data["pass_hat_k"]] == [1.0] * trials

    store = hx.Store(folder / "harness.db", readonly=True)
    rows = store.trials(run_id)
    assert store.verify().ok
    assert len(rows) == len({r.episode_id for r in rows}) == trials * len(writes_per_task)
    assert all(r.passed and r.outcome == "committed" for r in rows)
    store.close()
    # (The reference outcome of each task is computed in episodes of its own: not the run's.)
    lines = (tmp_path / "ledger").read_text().splitlines()
    done = Counter(tuple(line.split("\t")) for line in lines if line.startswith(run_id))
    assert set(done.values()) == {1}, [k for k, n in done.items() if n > 1]
    assert len(done) == trials * sum(writes_per_task)


@pytest.mark.parametrize("flag", ["--trust-agent", "--agent"])
def test_replay_of_an_own_agent_run_from_the_command_line(tmp_path: Path, flag: str):
    """`harness replay` re-runs a custom agent named on the command line (or trusted from
    the run's record) against an episode's record with no divergence."""
    own_suite(tmp_path)
    ran = harness_cli(
        tmp_path,
        *("run", "deliveries", "--agent", "careful_agent:CarefulAgent"),
        *("--trials", "1", "--logs", "logs", "--task", "pear-and-apple"),
    )
    assert ran.returncode == 0, ran.stderr
    (folder,) = (tmp_path / "logs").iterdir()
    named = ["--agent", "careful_agent:CarefulAgent"] if flag == "--agent" else [flag]
    replayed = harness_cli(
        tmp_path,
        *("replay", str(folder), "--episode", f"{folder.name}-pear-and-apple-0"),
        *("--trust-suite", *named, "--json"),
    )
    assert replayed.returncode == 0, replayed.stderr
    report = json.loads(replayed.stdout)
    assert report["divergence"] is None and report["replayed"] == report["steps"] == 2

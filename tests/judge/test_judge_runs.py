"""A judge model grades tasks' natural-language assertions: a judged task passes with a judge
that says met and fails with one that says unmet, its grades are recorded and never asked
again, and a run without a judge names the tasks it could not judge instead of passing them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import harness as hx
from harness.agents.judge import JUDGE_SYSTEM_PROMPT, judge_user_prompt, read_grades
from harness.cli import main
from harness.runs import run_trials
from harness.testing.model_server import FakeChatServer, text_reply

from ..toy_env import write_suite

ASSERTIONS = ["The agent says it is done.", "The agent bumps counter a."]


def judge_policy(met: bool) -> Any:
    """A judge server that grades every assertion it is asked about as ``met``."""

    def answer(request: dict[str, Any]) -> dict[str, Any]:
        asked = request["messages"][1]["content"]
        results = [
            {"expectedOutcome": a, "reasoning": f"judged {met}", "metExpectation": met}
            for a in ASSERTIONS
            if a in asked
        ]
        return text_reply(json.dumps({"results": results}))

    return answer


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    """The toy suite: t0 (one write) with the assertions, t1 (one write) without."""
    folder = write_suite(tmp_path / "suite", [1, 1])
    tasks = json.loads((folder / "tasks.json").read_text())
    tasks["tasks"][0]["nl_assertions"] = ASSERTIONS
    (folder / "tasks.json").write_text(json.dumps(tasks))
    return folder


@pytest.mark.parametrize("met", [True, False])
def test_the_judge_decides_a_judged_task(suite: Path, tmp_path: Path, met: bool):
    with FakeChatServer(judge_policy(met)) as server:
        result = run_trials(
            suite,
            agent="scripted",
            trials=2,
            logs=tmp_path / "logs",
            judge={"model": "judge-1", "base_url": server.base_url},
        )
        assert len(server.requests) == 2  # one per trial of t0, none for t1
        request = server.requests[0]
    assert request["model"] == "judge-1" and request["temperature"] == 0.0
    assert request["messages"][0] == {"role": "system", "content": JUDGE_SYSTEM_PROMPT}
    assert str(ASSERTIONS) in request["messages"][1]["content"]
    by_task = {(r.task_id, r.trial): r for r in result.results}
    assert by_task[("t0", 0)].passed is met and by_task[("t1", 0)].passed
    if not met:
        assert by_task[("t0", 0)].failure is not None
        assert by_task[("t0", 0)].failure[0] == "assertion unmet"
    store = hx.Store(result.folder / "harness.db")  # type: ignore[operator]
    (row,) = [r for r in store.trial_rows() if r.task_id == "t0" and r.trial == 0]
    (check,) = [c for c in json.loads(row.verdict)["checks"] if c["name"] == "nl_assertions"]
    assert check["passed"] is met and check["compared"]["judged"]
    assert [a["nl_assertion"] for a in check["compared"]["assertions"]] == ASSERTIONS
    assert store.verify().ok
    store.close()


def test_without_a_judge_a_judged_task_cannot_pass_and_the_run_says_so(suite: Path, tmp_path: Path):
    code_out = CliRunner().invoke(
        main,
        [
            "run",
            str(suite),
            "--agent",
            "scripted",
            "--trials",
            "1",
            "--logs",
            str(tmp_path / "logs"),
        ],
    )
    assert code_out.exit_code == 0, code_out.output
    out = " ".join(code_out.output.split())
    assert "not judged" in out
    (folder,) = (tmp_path / "logs").iterdir()
    evidence = json.loads((folder / "evidence.json").read_text())
    assert evidence["unjudged_tasks"] == ["t0"]
    report = json.loads(CliRunner().invoke(main, ["report", str(folder), "--json"]).output)
    assert report["failed_trials_by_class"] == {"not judged": 1}


def test_the_user_prompt_is_tau2s():
    """tau2's f-string, re-stated here as its source writes it."""
    trajectory_str, nl_assertions = "user: hi\nassistant: None", ["A", "B"]
    tau2 = f"""
        conversation:
        {trajectory_str}
        
        expectedOutcomes:
        {nl_assertions}
        """  # noqa: W293
    assert judge_user_prompt(trajectory_str, nl_assertions) == tau2


@pytest.mark.parametrize(
    ("reply", "met"),
    [
        (
            '{"results": [{"expectedOutcome": "B", "reasoning": "r", "metExpectation": true},'
            ' {"expectedOutcome": "A", "reasoning": "r", "metExpectation": true}]}',
            [True, True],
        ),
        (
            '```json\n{"results": [{"expectedOutcome": "A", "reasoning": "r", '
            '"metExpectation": true}]}\n```',
            [True, False],
        ),
    ],
)
def test_every_assertion_gets_a_grade(reply: str, met: list[bool]):
    """Grades are matched to assertions by text (then in order); one the reply leaves out is
    unmet, where tau2 would have passed it."""
    checks = read_grades(reply, ["A", "B"])
    assert [c.nl_assertion for c in checks] == ["A", "B"]
    assert [c.met for c in checks] == met


@pytest.mark.parametrize("reply", ["not json", '{"results": [{"metExpectation": "yes"}]}', "[]"])
def test_a_reply_that_is_not_the_json_asked_for_is_refused(reply: str):
    with pytest.raises(ValueError):
        read_grades(reply, ["A"])


def test_replay_export_and_report_never_ask_the_judge_again(suite: Path, tmp_path: Path):
    """Through the command line: --judge-model and --judge-base-url name the judge; once the
    run is over the judge's server is gone, and replay (the same grades, for the same
    conversation), the tau2 export (tau2's nl_assertions) and the report all read the
    record."""
    with FakeChatServer(judge_policy(True)) as server:
        result = CliRunner().invoke(
            main,
            [
                *("run", str(suite), "--agent", "scripted", "--trials", "1"),
                *("--logs", str(tmp_path / "logs"), "--judge-model", "judge-1"),
                *("--judge-base-url", server.base_url),
            ],
        )
        asked = len(server.requests)
    assert result.exit_code == 0, result.output
    assert "judge: model 'judge-1'" in result.output and asked == 1
    (folder,) = (tmp_path / "logs").iterdir()
    episode = f"{folder.name}-t0-0"
    code = CliRunner().invoke(
        main, ["replay", str(folder), "--episode", episode, "--json", "--suite", str(suite)]
    )
    assert code.exit_code == 0, code.output
    replayed = json.loads(code.output)
    assert replayed["verdict_matches"] is True and replayed["ended"] == "answered"
    out = tmp_path / "tau2.json"
    code = CliRunner().invoke(main, ["export", str(folder), "--format", "tau2", "--out", str(out)])
    assert code.exit_code == 0, code.output
    (sim,) = [s for s in json.loads(out.read_text())["simulations"] if s["task_id"] == "t0"]
    assert sim["reward_info"]["nl_assertions"] == [
        {"nl_assertion": a, "met": True, "justification": "judged True"} for a in ASSERTIONS
    ]
    config = json.loads(CliRunner().invoke(main, ["report", str(folder), "--json"]).output)[
        "config"
    ]
    assert config["judge"]["model"] == "judge-1" and "api_key" not in config["judge"]


def test_a_judge_key_goes_only_to_a_judge_server_you_name(
    suite: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The key is never recorded; resume gives HARNESS_JUDGE_API_KEY back only to the judge
    server the run recorded when you name it (HARNESS_JUDGE_BASE_URL) or trust the folder."""
    monkeypatch.setenv("HARNESS_JUDGE_API_KEY", "sk-judge-1")
    with FakeChatServer(judge_policy(True), api_key="sk-judge-1") as server:
        result = run_trials(
            suite,
            agent="scripted",
            logs=tmp_path / "logs",
            judge={"model": "judge-1", "base_url": server.base_url, "api_key": "sk-judge-1"},
        )
        assert result.results and all(r.passed for r in result.results)
        judge_url = server.base_url
    folder = result.folder
    assert folder is not None
    assert "sk-judge-1" not in (folder / "evidence.json").read_text()
    code = CliRunner().invoke(main, ["resume", str(folder), "--suite", str(suite)])
    assert code.exit_code == 2 and "HARNESS_JUDGE_BASE_URL=" in code.output
    monkeypatch.setenv("HARNESS_JUDGE_BASE_URL", judge_url)
    code = CliRunner().invoke(main, ["resume", str(folder), "--json", "--suite", str(suite)])
    assert code.exit_code == 0, code.output


class CutShortAgent:
    """A conversation that ended at max_steps, having done the task's writes."""

    name = "cut-short"

    def config(self) -> dict[str, Any]:
        return {"name": self.name}

    def run(self, task: Any, toolbox: Any, *, seed: int) -> Any:
        from harness.agents.base import AgentOutput

        for call in task.reference_actions:
            toolbox.call(call.name, dict(call.arguments))
        messages = [{"role": "assistant", "content": "working on it"}]
        return AgentOutput(
            message="working on it",
            meta={"messages": messages, "termination_reason": "max_steps"},
        )


def test_a_conversation_cut_short_is_not_judged(suite: Path, tmp_path: Path):
    """tau2 scores a conversation cut short 0 without asking its judge: so does the run, and
    the trial is `cut short`, never an infrastructure error of the judge's."""
    with FakeChatServer([text_reply("not json")]) as server:
        result = run_trials(
            suite,
            agent=CutShortAgent(),
            logs=tmp_path / "logs",
            judge={"model": "judge-1", "base_url": server.base_url},
        )
        asked = len(server.requests)
    assert asked == 0
    (t0,) = [r for r in result.results if r.task_id == "t0"]
    assert not t0.passed and not t0.infra_error
    assert t0.failure is not None and t0.failure[0] == "cut short"


class FinishedAgent(CutShortAgent):
    """As :class:`CutShortAgent`, its conversation ended by the user (so it is judged)."""

    def run(self, task: Any, toolbox: Any, *, seed: int) -> Any:
        out = super().run(task, toolbox, seed=seed)
        out.meta["termination_reason"] = "user_stop"
        return out


def test_a_judge_that_fails_keeps_the_agents_record_and_says_so(suite: Path, tmp_path: Path):
    """A reply that is not the JSON asked for: an infrastructure error of the trial (resume asks
    again), the agent's own record kept, the verdict saying the judge failed."""
    with FakeChatServer([text_reply("not json")]) as server:
        result = run_trials(
            suite,
            agent=FinishedAgent(),
            logs=tmp_path / "logs",
            judge={"model": "judge-1", "base_url": server.base_url},
        )
    (t0,) = [r for r in result.results if r.task_id == "t0"]
    assert t0.infra_error and not t0.passed
    store = hx.Store(result.folder / "harness.db")  # type: ignore[operator]
    (row,) = [r for r in store.trial_rows() if r.task_id == "t0"]
    store.close()
    meta = json.loads(row.agent_meta)
    assert meta["error"].startswith("JudgeReplyError:")
    # What the agent returned is kept beside the error, not replaced by it.
    assert meta["messages"] == [{"role": "assistant", "content": "working on it"}]
    assert meta["termination_reason"] == "user_stop"
    (check,) = [c for c in json.loads(row.verdict)["checks"] if c["name"] == "nl_assertions"]
    assert check["compared"]["reason"].startswith("the judge failed: JudgeReplyError")


def test_a_reply_that_grades_nothing_is_the_judges_failure():
    with pytest.raises(ValueError, match="grades none"):
        read_grades('{"results": []}', ["A"])


def test_a_recorded_judge_proxy_gets_no_key_and_a_keyless_judge_needs_no_naming(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A key goes nowhere a folder chose: not through a proxy it records either. A judge that
    ran without a key is given none back, so resuming it needs no server named."""
    plain = write_suite(tmp_path / "plain", [1])
    with FakeChatServer(judge_policy(True)) as server:
        url = server.base_url
        proxied = run_trials(
            plain,
            agent="scripted",
            logs=tmp_path / "a",
            judge={"model": "j", "base_url": url, "api_key": "sk-j", "proxy": "http://127.0.0.1:9"},
        )
        keyless = run_trials(
            plain, agent="scripted", logs=tmp_path / "b", judge={"model": "j", "base_url": url}
        )
    monkeypatch.setenv("HARNESS_JUDGE_API_KEY", "sk-j")
    monkeypatch.setenv("HARNESS_JUDGE_BASE_URL", url)
    refused = CliRunner().invoke(main, ["resume", str(proxied.folder), "--suite", str(plain)])
    assert refused.exit_code == 2 and "through the proxy http://127.0.0.1:9" in refused.output
    monkeypatch.delenv("HARNESS_JUDGE_BASE_URL")
    fine = CliRunner().invoke(main, ["resume", str(keyless.folder), "--suite", str(plain)])
    assert fine.exit_code == 0, fine.output

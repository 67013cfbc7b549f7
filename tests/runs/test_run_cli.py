"""`harness run` as a CI gate: progress, --fail-under, infrastructure failures and their causes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from harness.agents.openai import OpenAIAgent
from harness.cli import main
from harness.report import load_report
from harness.report.gate import EXIT_BELOW_BAR, EXIT_INFRA
from harness.runs.executors import Tally
from harness.runs.worker import TrialResult
from harness.testing.model_server import Failure, FakeChatServer, text_reply

from ..toy_env import write_suite


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The toy suite: two tasks of one and two required writes."""
    return write_suite(tmp_path_factory.mktemp("gate") / "suite", [1, 2])


def run(suite: Path, logs: Path, *args: str) -> Result:
    """`harness run SUITE --logs LOGS ARGS`."""
    return CliRunner().invoke(main, ["run", str(suite), "--logs", str(logs), *args])


def folder_of(result: Result) -> Path:
    """The run folder the command printed."""
    match = re.search(r"run folder: (\S+)", result.output)
    assert match, result.output
    return Path(match.group(1))


def trial(passed: bool, infra: bool = False) -> TrialResult:
    """A finished trial's result."""
    return TrialResult(
        task_id="t",
        trial=0,
        seed=0,
        episode_id="e",
        passed=passed,
        partial=None,
        outcome="committed",
        infra_error=infra,
    )


def test_the_tally_counts_done_passed_failed_and_infrastructure():
    """An infrastructure error counts there only, never as a pass or a fail."""
    tally = Tally()
    for r in (trial(True), trial(False), trial(False, infra=True), trial(True, infra=True)):
        tally.add(r)
    assert (tally.done, tally.passed, tally.failed, tally.infra) == (4, 1, 1, 2)
    assert str(tally) == "passed 1, failed 1, infrastructure 2"


def test_the_progress_bar_says_done_passed_failed_and_infrastructure(suite: Path, tmp_path: Path):
    """The progress line reads '4/4 done, passed 4, failed 0, infrastructure 0'."""
    out = run(suite, tmp_path, "--agent", "scripted", "--trials", "2")
    assert out.exit_code == 0, out.output
    assert "4/4 done, passed 4, failed 0, infrastructure 0" in out.output
    assert "passed 0" not in out.output


def test_run_passes_its_bar_on_the_point_estimate_and_fails_it_on_the_lower_bound(
    suite: Path, tmp_path: Path
):
    """Every trial passes: pass^2 = 1 clears 0.9 on the estimate, but its lower bound does not."""
    bar = ("--agent", "scripted", "--trials", "2", "--fail-under", "pass^2=0.9")
    point = run(suite, tmp_path / "point", *bar, "--fail-under-on", "point")
    assert point.exit_code == 0, point.output
    assert "judged on the point estimate" in point.output
    assert "pass^2 = 1.000" in point.output and "estimate 1.000 >= 0.9: ok" in point.output
    lower = run(suite, tmp_path / "lower", *bar)
    assert lower.exit_code == EXIT_BELOW_BAR, lower.output
    low = load_report(folder_of(lower)).pass_hat(2).low
    assert "judged on the lower bound of the interval" in lower.output
    assert f"lower bound {low:.3f} < 0.9: BELOW THE BAR" in lower.output
    assert "run folder:" in lower.output


def test_run_fails_a_bar_its_failing_agent_misses_on_either_basis(suite: Path, tmp_path: Path):
    """An agent that always errs is below pass@1=0.1 on the estimate and the lower bound."""
    for basis in ("point", "lower"):
        out = run(
            suite,
            tmp_path / basis,
            *("--agent", "simulated", "--error-rate", "1", "--trials", "2"),
            *("--fail-under", "pass@1=0.1", "--fail-under-on", basis),
        )
        assert out.exit_code == EXIT_BELOW_BAR, out.output
        assert "0 failed" not in out.output and "passed 0, failed 4" in out.output
        assert "pass@1 = 0.000" in out.output and "BELOW THE BAR" in out.output


@pytest.mark.parametrize(
    ("bar", "message"),
    [
        ("pass^3=0.5", "pass^3=0.5 needs at least 3 trials per task and the run has 2: lower k"),
        ("pass^3", 'is not METRIC=VALUE: write it as --fail-under "pass^4=0.8"'),
        ("success=0.5", "unknown metric 'success'"),
        ("pass@1=1.5", "must be a number from 0 to 1"),
    ],
)
def test_bad_bars_stop_the_run_before_any_trial(
    suite: Path, tmp_path: Path, bar: str, message: str
):
    """A bad bar, or a k beyond --trials, is a usage error naming the fix; nothing runs."""
    out = run(suite, tmp_path / "logs", "--trials", "2", "--fail-under", bar)
    assert out.exit_code == 2
    assert "--fail-under" in out.output and message in " ".join(out.output.split())
    assert not (tmp_path / "logs").exists()


def test_run_help_defines_when_infrastructure_failures_dominate():
    """`harness run --help` says the exit statuses and what 'dominate' means."""
    out = CliRunner().invoke(main, ["run", "--help"])
    text = " ".join(out.output.split())
    assert "more than half of the trials run ended in one" in text
    assert "--fail-under METRIC=VALUE" in text and "--fail-under-on [lower|point]" in text
    assert "--all-k" in text


def test_a_refusing_model_server_is_an_infrastructure_failure_with_its_cause(
    suite: Path, tmp_path: Path
):
    """A server that refuses every request (unknown model): each trial is an infrastructure
    failure, the summary and the audit name the cause, and the run exits 3."""
    with FakeChatServer([text_reply("done")], model="served") as server:
        out = run(
            suite,
            tmp_path,
            *("--agent", "openai", "--base-url", server.base_url, "--model", "other"),
            *("--trials", "2", "--fail-under", "pass^1=0"),
        )
    assert out.exit_code == EXIT_INFRA, out.output
    folder = folder_of(out)
    (cause,) = {f.cause for f in load_report(folder).infra_failures}
    assert cause.startswith("ModelRequestError: model server at ")
    assert cause.endswith("refused the request: HTTP 404: The model `other` does not exist.")
    text = " ".join(out.output.split())
    assert "4/4 done, passed 0, failed 0, infrastructure 4" in text
    assert "infrastructure failures: 4 of 4 trials (more than half" in text
    assert f"4 x {cause}" in text
    audit = CliRunner().invoke(main, ["audit", str(folder), "--episode", f"{folder.name}-t0-0"])
    assert audit.exit_code == 0, audit.output
    assert f"infrastructure failure (not the agent's): {cause}" in " ".join(audit.output.split())
    data = json.loads(CliRunner().invoke(main, ["audit", str(folder), "--json"]).output)
    assert {e["infra_cause"] for e in data["episodes"]} == {cause}


def test_a_model_server_that_is_down_fails_the_run_with_connection_refused(
    suite: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Nothing listening at --base-url: every trial fails for infrastructure, the summary says
    the server cannot be reached, and the run exits 3 even without a bar."""
    monkeypatch.setitem(OpenAIAgent.__init__.__kwdefaults__, "sleep", lambda _seconds: None)
    with FakeChatServer([]) as server:
        url = server.base_url
    out = run(suite, tmp_path, "--agent", "openai", "--base-url", url, "--trials", "1")
    assert out.exit_code == EXIT_INFRA, out.output
    text = " ".join(out.output.split())
    assert "2/2 done, passed 0, failed 0, infrastructure 2" in text
    # (one group, or two when the attempts' wall time, part of the cause's "in 7.0 s", differs
    # between the trials on a loaded machine)
    cause = r"(\d+) x ModelServerError: model server at [^;]*; last: cannot reach"
    groups = re.findall(cause, text)
    assert sum(int(n) for n in groups) == 2, text
    assert "t0 trial 0" in text and "t1 trial 0" in text


def test_a_minority_of_infrastructure_failures_is_shown_and_the_run_exits_0(
    suite: Path, tmp_path: Path
):
    """One refused request in four trials: shown with its cause, and it does not dominate."""
    refused = Failure.http(400, "context too long")
    with FakeChatServer([text_reply("done")], failures=[refused]) as server:
        out = run(
            suite, tmp_path, "--agent", "openai", "--base-url", server.base_url, "--trials", "2"
        )
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "4/4 done, passed 0, failed 3, infrastructure 1" in text
    assert "infrastructure failures: 1 of 4 trials" in text and "more than half" not in text
    assert re.search(
        r"1 x ModelRequestError: model server at \S+ refused the request: HTTP 400: "
        r"context too long t0 trial 0",
        text,
    )


def test_output_that_is_not_a_terminal_gets_a_plain_line_every_tenth_of_the_trials(
    suite: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """In a CI log or a file a redrawn bar wraps and is cut: a run there prints a plain line
    every tenth of its trials and at the last (24 trials: every 3), with the tally, what is in
    flight and the time so far, and no bar; on a terminal, the live bar."""
    out = run(suite, tmp_path / "log", "--agent", "scripted", "--trials", "12")
    assert out.exit_code == 0, out.output
    pattern = re.compile(
        r"^(\S+) x 12: (\d+)/24 done, passed (\d+), failed 0, infrastructure 0, "
        r"in flight \d+, \d+:\d\d:\d\d$",
        re.M,
    )
    lines = pattern.findall(out.output)
    assert [int(done) for _, done, _ in lines] == list(range(3, 25, 3)), out.output
    assert all(done == passed for _, done, passed in lines)
    assert "━" not in out.output.split("pass^k")[0], out.output

    from harness.cli import _common

    monkeypatch.setattr(_common.console, "_force_terminal", True)
    bar = run(suite, tmp_path / "tty", "--agent", "scripted", "--trials", "2")
    assert bar.exit_code == 0, bar.output
    assert "━" in bar.output.split("pass^k")[0] and not pattern.search(bar.output)


def test_a_model_server_of_ones_own_from_the_environment_alone_and_the_defaults_said(
    suite: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """HARNESS_OPENAI_BASE_URL, HARNESS_OPENAI_MODEL and HARNESS_OPENAI_API_KEY reach a server
    that wants that model and key with no flag given, and the run says where each came from;
    with none set, the run says out loud that it uses model 'default' at 127.0.0.1:8000 and how
    to change them; --help names the variables and the defaults."""
    for name in ("HARNESS_OPENAI_BASE_URL", "HARNESS_OPENAI_MODEL", "HARNESS_OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with FakeChatServer([text_reply("done")], model="served", api_key="sk-own") as server:
        monkeypatch.setenv("HARNESS_OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("HARNESS_OPENAI_MODEL", "served")
        monkeypatch.setenv("HARNESS_OPENAI_API_KEY", "sk-own")
        own = server.base_url
        out = run(suite, tmp_path / "own", "--agent", "openai", "--trials", "1")
        assert server.last_request["model"] == "served"
    text = " ".join(out.output.split())
    assert "2/2 done, passed 0, failed 2, infrastructure 0" in text, out.output
    assert (
        f"openai agent: model 'served' (HARNESS_OPENAI_MODEL) at {own} "
        "(HARNESS_OPENAI_BASE_URL), its key from HARNESS_OPENAI_API_KEY"
    ) in text
    assert "sk-own" not in out.output

    for name in ("HARNESS_OPENAI_BASE_URL", "HARNESS_OPENAI_MODEL", "HARNESS_OPENAI_API_KEY"):
        monkeypatch.delenv(name)
    with FakeChatServer([]) as dead:
        url = dead.base_url
    out = run(suite, tmp_path / "flags", "--agent", "openai", "--base-url", url, "--trials", "1")
    text = " ".join(out.output.split())
    assert (
        f"openai agent: model 'default' (the default: set --model or HARNESS_OPENAI_MODEL) at "
        f"{url} (--base-url), no key (a hosted API needs HARNESS_OPENAI_API_KEY)"
    ) in text, out.output

    help_text = " ".join(CliRunner().invoke(main, ["run", "--help"]).output.split())
    assert "[default: HARNESS_OPENAI_BASE_URL, else http://127.0.0.1:8000/v1]" in help_text
    assert "[default: HARNESS_OPENAI_MODEL, else 'default']" in help_text
    assert "HARNESS_OPENAI_API_KEY" in help_text and "docs/models.md" in help_text

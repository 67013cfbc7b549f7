"""Tools called bare (``run_trials(transactions=False)``) beside the same tools as transactions.

A bare run calls each tool's own function, as a plain tau2 environment does: no preconditions,
postconditions, compensations or retries. Its trials are recorded and judged the same way, so
``harness compare`` of a run with transactions and one without gives the paired difference in
pass^k that the transactions make.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import harness as hx
from harness.cli import main
from harness.report import load_report
from harness.report.export import export_run
from harness.report.model import compare_reports
from harness.runs.replay import replay_episode
from harness.runs.start import run_trials
from harness.runs.toolbox import bare_calls
from harness.suite import Suite, load_suite

pytest.importorskip("pydantic")

TASKS = ["retail-001", "retail-002", "retail-003", "retail-004"]

# The first write of every trial fails once with a transient error (a dropped connection).
FIRST_WRITE_FAILS = {
    "version": 1,
    "seed": 1,
    "faults": [{"kind": "fail_stop", "service": "writes", "calls": [1], "transient": True}],
}
# The first write of every trial answers success but leaves no effect.
FIRST_WRITE_SILENT = {
    "version": 1,
    "seed": 1,
    "faults": [{"kind": "silent", "service": "writes", "calls": [1], "mode": "missing"}],
}


@pytest.fixture(scope="module")
def retail() -> Suite:
    """The built-in retail suite, loaded once (its reference outcomes computed once)."""
    return load_suite("retail")


def _pair(
    base: Path, suite: Suite, plan: dict[str, object] | None, trials: int = 2
) -> tuple[Path, Path]:
    """The scripted agent on TASKS twice: with transactions (run ``tx``) and bare (``bare``)."""
    faults = None
    if plan is not None:
        faults = base / "faults.json"
        faults.write_text(json.dumps(plan))
    runs = []
    for transactions in (True, False):
        result = run_trials(
            suite,
            agent="scripted",
            trials=trials,
            tasks=TASKS,
            logs=base / "logs",
            run_id="tx" if transactions else "bare",
            faults=faults,
            transactions=transactions,
        )
        runs.append(result.folder)
    return runs[0], runs[1]


@pytest.fixture(scope="module")
def failing(tmp_path_factory: pytest.TempPathFactory, retail: Suite) -> tuple[Path, Path]:
    """The pair of runs where the first write of every trial fails once (2 trials)."""
    return _pair(tmp_path_factory.mktemp("failing"), retail, FIRST_WRITE_FAILS)


def test_without_faults_bare_tools_do_what_transactions_do(tmp_path: Path, retail: Suite) -> None:
    """With nothing injected, the bare run passes every trial, leaves no transaction, records
    every call with the changes it made, and those are the changes the transactions made."""
    tx, bare = _pair(tmp_path, retail, None, trials=1)
    cmp = compare_reports(load_report(tx), load_report(bare))
    assert [row[2].value for row in cmp.rows] == [0.0]
    assert cmp.a.transactions is True and cmp.b.transactions is False
    store = hx.Store(f"sqlite:///{bare}/harness.db")
    tx_store = hx.Store(f"sqlite:///{tx}/harness.db")
    for row in store.trial_rows("bare"):
        assert row.passed
        assert store.transactions(row.episode_id) == []
        calls = bare_calls(store.log(row.episode_id))
        twin = row.episode_id.replace("bare-", "tx-", 1)
        committed = [t for t in tx_store.transactions(twin) if t.mutating]
        assert [c.tool for c in calls] == [t.action for t in committed]
        assert all(c.ok for c in calls)
        assert [set(c.changes) for c in calls] == [set(t.diff or {}) for t in committed]
        # Steps count bare writes as committed ones.
        assert json.loads(row.steps) == [True] * len(calls)
    evidence = json.loads((bare / "evidence.json").read_text())
    assert evidence["transactions"] is False
    assert json.loads((tx / "evidence.json").read_text())["transactions"] is True


def test_a_transient_failure_is_retried_only_with_transactions(
    failing: tuple[Path, Path],
) -> None:
    """The first write fails once: transactions retry it and commit; bare, the agent gets the
    error, the write never happens, and every trial fails. compare gives the paired
    difference, with its interval, at every k."""
    tx, bare = failing
    a, b = load_report(tx), load_report(bare)
    assert a.pass_hat(1).value == 1.0 and b.pass_hat(1).value == 0.0
    cmp = compare_reports(a, b)
    assert [row[2].k for row in cmp.rows] == [1, 2]
    for ea, eb, d in cmp.rows:
        assert d.value == pytest.approx(ea.value - eb.value) == pytest.approx(1.0)
        assert d.low <= d.value <= d.high
    tx_store = hx.Store(f"sqlite:///{tx}/harness.db")
    for row in tx_store.trial_rows("tx"):
        first = next(t for t in tx_store.transactions(row.episode_id) if t.mutating)
        assert first.status == "committed" and first.attempts == 2
    store = hx.Store(f"sqlite:///{bare}/harness.db")
    for row in store.trial_rows("bare"):
        assert not row.passed and json.loads(row.failures) == {"tool_error": 1}
        calls = bare_calls(store.log(row.episode_id))
        assert not calls[0].ok and calls[0].changes == {}
        assert "injected" in (calls[0].error or "")
        # The verdict is on the state: the failed write left nothing.
        verdict = json.loads(row.verdict)
        assert not verdict["passed"]


def test_a_silent_failure_is_caught_only_with_transactions(tmp_path: Path, retail: Suite) -> None:
    """The first write answers success without its effect: the postconditions catch it and the
    retry makes it; bare, the agent believes it and the trial fails on its state."""
    tx, bare = _pair(tmp_path, retail, FIRST_WRITE_SILENT, trials=1)
    cmp = compare_reports(load_report(tx), load_report(bare))
    assert [round(row[2].value, 6) for row in cmp.rows] == [1.0]
    store = hx.Store(f"sqlite:///{bare}/harness.db")
    for row in store.trial_rows("bare"):
        first = bare_calls(store.log(row.episode_id))[0]
        assert first.ok and first.changes == {}  # "done", and nothing happened
        assert not row.passed


def test_compare_command_reports_the_paired_difference(failing: tuple[Path, Path]) -> None:
    """harness compare of the two runs prints which ran bare and the paired A - B; --json has
    each run's transactions flag and the difference at each k."""
    tx, bare = failing
    runner = CliRunner()
    out = runner.invoke(main, ["compare", str(tx), str(bare), "--allow-unverified"])
    assert out.exit_code == 0, out.output
    assert "A as transactions, B called bare" in out.output
    assert "+1.000" in out.output
    out = runner.invoke(main, ["compare", str(tx), str(bare), "--json", "--allow-unverified"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["a"]["transactions"] is True and data["b"]["transactions"] is False
    assert [r["difference"]["value"] for r in data["rows"]] == [1.0, 1.0]


def test_a_bare_trial_replays_and_exports_from_its_record(
    failing: tuple[Path, Path], tmp_path: Path
) -> None:
    """A bare episode's state is rebuilt from its recorded calls (the verdict comes out the
    same), its agent re-runs against the record without diverging, and the tau2 export lists
    its calls and says the tools ran bare."""
    _, bare = failing
    store = hx.Store(f"sqlite:///{bare}/harness.db")
    row = store.trial_rows("bare")[0]
    report = replay_episode(bare, row.episode_id, suite="retail")
    assert report.divergence is None and report.ended == "answered"
    assert report.verdict["passed"] == json.loads(row.verdict)["passed"]
    assert report.verdict == json.loads(row.verdict)
    data = json.loads(export_run(bare, "tau2", tmp_path / "t2.json").read_text())
    assert data["info"]["agent_info"]["llm_args"]["harness"]["transactions"] is False
    sim = next(s for s in data["simulations"] if s["id"] == row.episode_id)
    calls = [c["name"] for m in sim["messages"] for c in m.get("tool_calls") or []]
    writes = [c.tool for c in bare_calls(store.log(row.episode_id))]
    assert [c for c in calls if c in writes] == writes and len(calls) > len(writes)
    errors = [m for m in sim["messages"] if m["role"] == "tool" and m["error"]]
    assert errors and errors[0]["content"].startswith("Error: ")


def test_harness_run_no_transactions_records_a_bare_run(tmp_path: Path) -> None:
    """`harness run --no-transactions` calls the tools bare and says so in the run's record."""
    import harness as hx

    out = CliRunner().invoke(
        main,
        [
            "run",
            "retail",
            "--agent",
            "scripted",
            "--trials",
            "1",
            "--task",
            "retail-001",
            "--logs",
            str(tmp_path),
            "--no-transactions",
        ],
    )
    assert out.exit_code == 0, out.output
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    store = hx.Store(f"sqlite:///{folder / 'harness.db'}")
    try:
        (trial,) = store.trials()
        assert trial.passed
        assert store.transactions(trial.episode_id) == []  # no transaction: the tools ran bare
    finally:
        store.close()
    evidence = json.loads((folder / "evidence.json").read_text())
    assert evidence["transactions"] is False


def test_a_bare_call_with_arguments_that_do_not_fit_reads_as_tau2s(
    tmp_path: Path, retail: Suite
) -> None:
    """tau2's environment answers a call whose arguments do not fit the tool with Python's own
    words (``Error: RetailTools.cancel_pending_order() got an unexpected keyword argument``), and
    so does a bare toolbox: no harness prefix in what the agent reads."""
    from harness.runs.toolbox import make_toolbox

    env = retail.new_environment()
    try:
        with hx.Episode(state=env.state, store=tmp_path / "h.db") as ep:
            box = make_toolbox(env.tools, ep, env, transactions=False)
            result = box.call(
                "cancel_pending_order", {"order_id": "#W0000000", "reason": "x", "extra": 1}
            )
            missing = box.call("cancel_pending_order", {"order_id": "#W0000000"})
    finally:
        env.close()
    assert not result.ok and result.kind == "invalid"
    assert result.as_text() == (
        "Error: RetailTools.cancel_pending_order() got an unexpected keyword argument 'extra'"
    )
    assert missing.as_text() == (
        "Error: RetailTools.cancel_pending_order() missing 1 required positional argument: 'reason'"
    )

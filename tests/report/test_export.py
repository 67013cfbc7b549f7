"""Exports: files tau-bench's and tau2-bench's own scorers accept, and JSON lines."""

from __future__ import annotations

import json
import math
from math import comb
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import BaseModel

from harness.cli import main
from harness.errors import RunNotFound
from harness.report import load_report
from harness.report.export import export_run
from harness.runs.start import run_trials

from ..toy_env import write_suite
from .test_report import make_run

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run of the toy suite with transactions: 4 tasks, 3 trials, 30% step errors."""
    base = tmp_path_factory.mktemp("toy")
    suite = write_suite(base / "suite", [0, 1, 2, 3])
    result = run_trials(
        suite,
        agent="simulated",
        agent_options={"error_rate": 0.3},
        trials=3,
        seed=5,
        logs=base / "logs",
        run_id="toy",
    )
    return result.folder


# --- tau-bench: its result record and its display_metrics, as upstream defines them ---


class EnvRunResult(BaseModel):
    """tau_bench.types.EnvRunResult."""

    task_id: int
    reward: float
    info: dict[str, Any]
    traj: list[dict[str, Any]]
    trial: int


def taubench_display_metrics(results: list[EnvRunResult]) -> dict[int, float]:
    """tau_bench.run.display_metrics, returning pass^k instead of printing it."""

    def is_successful(reward: float) -> bool:
        return (1 - 1e-6) <= reward <= 1 + 1e-6

    num_trials = len({r.trial for r in results})
    c_per_task_id: dict[int, int] = {}
    for result in results:
        if result.task_id not in c_per_task_id:
            c_per_task_id[result.task_id] = 1 if is_successful(result.reward) else 0
        else:
            c_per_task_id[result.task_id] += 1 if is_successful(result.reward) else 0
    pass_hat_ks: dict[int, float] = {}
    for k in range(1, num_trials + 1):
        sum_task_pass_hat_k = 0.0
        for c in c_per_task_id.values():
            sum_task_pass_hat_k += comb(c, k) / comb(num_trials, k)
        pass_hat_ks[k] = sum_task_pass_hat_k / len(c_per_task_id)
    return pass_hat_ks


def _load_taubench(path: Path) -> list[EnvRunResult]:
    return [EnvRunResult.model_validate(r) for r in json.loads(path.read_text())]


def test_taubench_display_metrics_reproduces_the_report(toy_run: Path, tmp_path: Path):
    """tau-bench's own pass^k formula on the exported file gives the report's pass^k."""
    out = export_run(toy_run, "taubench", tmp_path / "tb.json", trust=True)
    results = _load_taubench(out)
    report = load_report(toy_run)
    assert len(results) == report.n_trials == 12
    assert {r.task_id for r in results} == {0, 1, 2, 3}  # harness ids numbered in run order
    assert {r.info["harness_task_id"] for r in results} == {"t0", "t1", "t2", "t3"}
    theirs = taubench_display_metrics(results)
    assert sorted(theirs) == [1, 2, 3]
    for k, value in theirs.items():
        assert value == pytest.approx(report.pass_hat(k).value, abs=1e-12)


def test_taubench_records_carry_verdict_and_a_tool_call_trajectory(toy_run: Path, tmp_path: Path):
    """Each record's info holds the verdict and reward info; traj lists the attempted writes."""
    results = _load_taubench(export_run(toy_run, "taubench", tmp_path / "tb.json", trust=True))
    record = next(r for r in results if r.info["harness_task_id"] == "t3")
    assert record.reward in (0.0, 1.0) and record.info["passed"] == (record.reward == 1.0)
    assert set(record.info["reward_info"]) == {"reward", "info", "actions"}
    assert [a["name"] for a in record.info["reward_info"]["actions"]] == ["look"] + ["bump"] * 3
    assert record.info["task"]["instruction"] == "bump 3 counters"
    calls = [m for m in record.traj if m["role"] == "assistant" and m.get("tool_calls")]
    tools = [m for m in record.traj if m["role"] == "tool"]
    assert calls and len(calls) == len(tools)
    assert [c["tool_calls"][0]["function"]["name"] for c in calls][:2] == ["look", "bump"]
    assert [t["tool_call_id"] for t in tools] == [c["tool_calls"][0]["id"] for c in calls]


def test_taubench_infra_errors_are_failures_or_left_out(tmp_path: Path):
    """Under fail an infra error is a reward-0 record matching the report; under exclude, gone."""
    folder = make_run(tmp_path, "r", {"a": "PPIP", "b": "PFFP", "c": "IPPP"})
    results = _load_taubench(export_run(folder, "taubench", tmp_path / "fail.json", trust=True))
    assert len(results) == 12
    infra = [r for r in results if r.info["infra_error"]]
    assert len(infra) == 2 and all(r.reward == 0.0 and "error" in r.info for r in infra)
    report = load_report(folder)
    for k, value in taubench_display_metrics(results).items():
        assert value == pytest.approx(report.pass_hat(k).value, abs=1e-12)
    kept = _load_taubench(
        export_run(folder, "taubench", tmp_path / "ex.json", infra="exclude", trust=True)
    )
    assert len(kept) == 10 and not any(r.info["infra_error"] for r in kept)


# --- tau2-bench: its Results models (the fields its metrics read) and its pass^k ---


from .test_tau2_export import (  # noqa: E402
    AssistantMessage,
    Results,
    StructuredUserInstructions,
    ToolMessage,
    UserMessage,
)


def tau2_pass_hat_ks(results: Results) -> dict[int, float]:
    """tau2.metrics.agent_metrics: get_metrics_df and get_tasks_pass_hat_k, without pandas."""
    sims = [
        s for s in results.simulations if s.termination_reason != "infrastructure_error"
    ]  # their metrics exclude infrastructure errors
    by_task: dict[str, list[bool]] = {}
    for sim in sims:
        assert sim.reward_info is not None
        reward = sim.reward_info.reward
        by_task.setdefault(sim.task_id, []).append((1 - 1e-6) <= reward <= (1 + 1e-6))
    max_k = min(results.info.num_trials, min(len(v) for v in by_task.values()))
    for task in results.tasks:  # to_df looks up every simulation's task and its action counts
        assert task.evaluation_criteria is not None
        task.evaluation_criteria.info()
    return {
        k: sum(comb(sum(v), k) / comb(len(v), k) for v in by_task.values()) / len(by_task)
        for k in range(1, max_k + 1)
    }


def test_tau2_results_validate_and_its_pass_k_reproduces_the_report(toy_run: Path, tmp_path: Path):
    """The tau2 export validates as Results and tau2's pass^k equals the report's."""
    results = Results.model_validate_json(
        export_run(toy_run, "tau2", tmp_path / "t2.json", trust=True).read_text()
    )
    report = load_report(toy_run, infra="exclude")
    assert len(results.simulations) == 12 and {t.id for t in results.tasks} == {
        "t0",
        "t1",
        "t2",
        "t3",
    }
    assert results.info.num_trials == 3
    for k, value in tau2_pass_hat_ks(results).items():
        assert value == pytest.approx(report.pass_hat(k).value, abs=1e-12)
    sim = next(s for s in results.simulations if s.task_id == "t3")
    assert sim.reward_info is not None and sim.reward_info.db_check is not None
    assert sim.reward_info.db_check.db_match == (sim.reward_info.reward == 1.0)
    assert sim.messages is not None and isinstance(sim.messages[0], UserMessage)
    assert isinstance(sim.messages[1], AssistantMessage) and sim.messages[1].tool_calls
    assert isinstance(sim.messages[2], ToolMessage)
    assert sim.messages[2].id == sim.messages[1].tool_calls[0].id
    task = next(t for t in results.tasks if t.id == "t3")
    assert task.evaluation_criteria is not None
    assert task.evaluation_criteria.info()["num_agent_actions"] == 4


def test_tau2_marks_infra_errors_so_its_metrics_exclude_them(tmp_path: Path):
    """Infrastructure errors become termination_reason infrastructure_error (tau2 excludes)."""
    folder = make_run(tmp_path, "r", {"a": "PPIP", "b": "PFFP", "c": "IPPP"})
    results = Results.model_validate_json(
        export_run(folder, "tau2", tmp_path / "t2.json", trust=True).read_text()
    )
    reasons = [s.termination_reason.value for s in results.simulations]
    assert reasons.count("infrastructure_error") == 2 and reasons.count("agent_stop") == 10
    report = load_report(folder, infra="exclude")
    theirs = tau2_pass_hat_ks(results)
    assert sorted(theirs) == [1, 2, 3] == report.curve.ks.tolist()
    for k, value in theirs.items():
        assert value == pytest.approx(report.pass_hat(k).value, abs=1e-12)


def test_tau2_tasks_keep_their_structured_user_instructions(tmp_path: Path):
    """A run of tau2's own tasks.json exports its tasks with tau2's structured instructions."""
    tasks = SHARED / "tau2-retail" / "tasks.json"
    if not tasks.exists():
        pytest.skip("the shared tau2 data is not beside the repository")
    result = run_trials(tasks, agent="scripted", trials=1, logs=tmp_path / "logs", tasks=["0", "1"])
    results = Results.model_validate_json(
        export_run(result.folder, "tau2", tmp_path / "t2.json", trust=True).read_text()
    )
    assert [s.reward_info.reward for s in results.simulations if s.reward_info] == [1.0, 1.0]
    scenario = results.tasks[0].user_scenario.instructions
    assert isinstance(scenario, StructuredUserInstructions) and scenario.domain == "retail"
    taub = _load_taubench(export_run(result.folder, "taubench", tmp_path / "tb.json", trust=True))
    assert sorted(r.task_id for r in taub) == [0, 1]  # tau2's integer ids are kept


# --- jsonl and the command ---


def test_jsonl_has_one_object_per_trial_with_its_transactions(toy_run: Path, tmp_path: Path):
    """Each line is one trial: ids, verdict, steps and the transactions it ran."""
    lines = export_run(toy_run, "jsonl", tmp_path / "x.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == 12
    assert {(r["task_id"], r["trial"]) for r in records} == {
        (f"t{i}", j) for i in range(4) for j in range(3)
    }
    t3 = [r for r in records if r["task_id"] == "t3"]
    assert all(r["transactions"] and r["transactions"][0]["action"] == "bump" for r in t3)
    assert all(len(r["steps"]) == 3 and "verdict" in r and "seed" in r for r in t3)


def test_cli_export_writes_into_the_run_folder_by_default(tmp_path: Path):
    """`harness export RUN --format F` writes export-F.json in the run folder and says where."""
    folder = make_run(tmp_path, "r", {"a": "PF"})
    for fmt, name in (("taubench", "export-taubench.json"), ("tau2", "export-tau2.json")):
        out = CliRunner().invoke(main, ["export", str(folder), "--format", fmt])
        assert out.exit_code == 0, out.output
        assert name in out.output and json.loads((folder / name).read_text())
    out = CliRunner().invoke(
        main, ["export", str(folder), "--format", "jsonl", "--out", str(tmp_path / "o.jsonl")]
    )
    assert out.exit_code == 0 and len((tmp_path / "o.jsonl").read_text().splitlines()) == 2


def test_export_of_a_missing_run_fails_cleanly(tmp_path: Path):
    """Exporting a folder that is not a run exits 2 naming it, and writes no file."""
    out = CliRunner().invoke(main, ["export", str(tmp_path / "nope"), "--format", "jsonl"])
    assert out.exit_code == 2 and "no run folder" in out.output
    assert not (tmp_path / "nope").exists()
    with pytest.raises(RunNotFound):
        export_run(tmp_path / "nope", "tau2", trust=True)


def _strict(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise AssertionError(f"bare {name} in the JSON")

    return json.loads(text, parse_constant=refuse)


def test_a_stored_nan_is_written_as_null(toy_run: Path, tmp_path: Path) -> None:
    """A NaN or infinity in a transaction's result, a trial's partial score or its agent
    metadata: every export and the report JSON are strict JSON (null), no .tmp is left.
    (Written behind the harness's back, these edits fail verification: read anyway.)"""
    import shutil
    import sqlite3

    run = tmp_path / "toy"
    shutil.copytree(toy_run, run)
    conn = sqlite3.connect(run / "harness.db")
    conn.execute("UPDATE hx_transaction SET result = 'NaN'")
    conn.execute(
        'UPDATE hx_trial SET partial = ?, agent_meta = \'{"cost": NaN, "t": -Infinity}\'',
        (math.inf,),
    )
    conn.commit()
    conn.close()
    out = tmp_path / "out"
    for fmt in ("jsonl", "taubench", "tau2"):
        target = out / f"x.{fmt}"
        result = CliRunner().invoke(
            main,
            ["export", str(run), "--format", fmt, "--out", str(target), "--allow-unverified"],
        )
        assert result.exit_code == 0, (fmt, result.output, result.exception)
        text = target.read_text()
        assert "NaN" not in text.replace('"NaN"', "") and "Infinity" not in text, fmt
        if fmt == "jsonl":
            records = [_strict(line) for line in text.splitlines()]
            assert records[0]["partial"] is None
            assert records[0]["agent_meta"] == {"cost": None, "t": None}
            assert any(t["result"] is None for r in records for t in r["transactions"])
        else:
            _strict(text)
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    result = CliRunner().invoke(main, ["report", str(run), "--json", "--allow-unverified"])
    assert result.exit_code == 0, (result.output, result.exception)
    assert "UNVERIFIED" in result.stderr
    _strict(result.stdout)


def test_export_loads_a_recorded_suite_only_when_told_to(toy_run: Path, tmp_path: Path) -> None:
    """A run folder whose recorded suite path was edited to a suite with a module of its own is
    exported without importing that module: the export carries no instructions and says how to
    include them; --suite names the suite to load, and only --trust-suite loads the recorded
    path."""
    import shutil
    import sqlite3

    run = Path(shutil.copytree(toy_run, tmp_path / "toy"))
    marker = tmp_path / "imported"
    evil = tmp_path / "evil"
    shutil.copytree(toy_run.parents[1] / "suite", evil)
    (evil / "evil.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
        "from tests.toy_env import ToyEnvironment as Env\n"
    )
    manifest = json.loads((evil / "suite.json").read_text())
    manifest["environment"] = "evil:Env"
    (evil / "suite.json").write_text(json.dumps(manifest))
    with sqlite3.connect(run / "harness.db") as conn:
        conn.execute(f"UPDATE hx_run SET config = json_set(config, '$.suite_path', '{evil}')")
    conn.close()

    def export(*extra: str) -> tuple[Any, list[Any]]:
        out = tmp_path / "out.json"
        result = CliRunner().invoke(
            main,
            [
                "export",
                str(run),
                "--format",
                "tau2",
                "--out",
                str(out),
                "--allow-unverified",
                *extra,
            ],
        )
        assert result.exit_code == 0, result.output
        return result, json.loads(out.read_text())["tasks"]

    # The edit is found first: every trial's start record binds the run's configuration.
    found = CliRunner().invoke(main, ["export", str(run), "--format", "tau2"])
    assert found.exit_code == 2 and "fails verification" in " ".join(found.output.split())

    result, tasks = export()
    assert not marker.exists()
    assert "not built in" in result.stderr and "--trust-suite" in result.stderr
    result, named = export("--suite", str(toy_run.parents[1] / "suite"))
    assert not marker.exists() and "note" not in result.stderr
    assert len(named) == 4 and len(named) >= len(tasks)
    assert named != tasks  # the named suite's instructions are in the export
    export("--trust-suite")
    assert marker.exists()

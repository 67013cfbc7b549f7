"""Reports: a run read back from its folder, as tables, JSON, HTML (rendered in Chromium)."""

from __future__ import annotations

import json
import math
import re
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import harness as hx
from harness import stats
from harness.cli import main
from harness.errors import RunNotFound
from harness.report import REPORT_FORMAT, compare_reports, load_report, render_html
from harness.runs.start import run_trials
from harness.store import RunRow, TrialRow

from ..browser import layout, needs_chromium
from ..toy_env import write_suite

EVIDENCE: dict[str, Any] = {
    "harness_version": "0.1.0",
    "suite": {
        "name": "synthetic",
        "version": "1",
        "environment": "tests.toy_env:ToyEnvironment",
        "tasks": {},
    },
    "tool_versions": {"bump": "0123456789abcdef"},
    "agent": {"name": "simulated", "error_rate": 0.1},
    "policy": {"decisions": {"silent": "retry"}, "retry": {"attempts": 3, "backoff": 0.5}},
    "partial_credit": {},
    "trials": 4,
    "seed": 0,
    "infra_error_policy": "fail",
    "machine": {"python": "3.11", "platform": "test", "cpus": 1},
}


def make_run(
    logs: Path,
    run_id: str,
    cells: dict[str, str],
    *,
    steps: dict[str, int] | None = None,
    partial: float | None = 0.5,
    versions: dict[str, str] | None = None,
    status: str = "finished",
    trials: int | None = None,
) -> Path:
    """A run folder written straight into a store: per task a string of trial outcomes
    (the run ``status`` given, started for ``trials`` a task: by default the longest string).

    ``P`` passed, ``F`` failed (its first required step unverified), ``I`` infrastructure
    error (no step verified), ``-`` no trial at that index (an interrupted run).
    """
    folder = logs / run_id
    store = hx.Store(folder / "harness.db", create=True)
    evidence = json.loads(json.dumps(EVIDENCE))
    evidence["suite"]["tasks"] = {
        t: {"version": (versions or {}).get(t, "1"), "digest": f"d-{t}-{(versions or {}).get(t)}"}
        for t in cells
    }
    evidence["partial_credit"] = {t: "steps" for t in cells}
    planned = trials or max(map(len, cells.values()))
    config = {"tasks": list(cells), "trials": planned, "seed": 0}
    store.add(
        RunRow(
            id=run_id,
            created_at=1_700_000_000.0,
            suite="synthetic",
            status=status,
            config=json.dumps(config),
            evidence=json.dumps(evidence),
        )
    )
    for task, outcomes in cells.items():
        m = (steps or {}).get(task, 2)
        for i, c in enumerate(outcomes):
            if c == "-":
                continue
            ok = [c == "P" or j > 0 for j in range(m)] if c != "I" else [False] * m
            store.add(
                TrialRow(
                    id=f"{run_id}-{task}-{i}",
                    run_id=run_id,
                    task_id=task,
                    task_version=(versions or {}).get(task, "1"),
                    trial=i,
                    seed=100 + i,
                    episode_id=f"{run_id}-{task}-{i}",
                    passed=c == "P",
                    partial=None if partial is None else (1.0 if c == "P" else partial),
                    outcome="failed" if c == "I" else "committed",
                    infra_error=c == "I",
                    failures=json.dumps({"precondition": 1} if c == "F" else {}),
                    steps=json.dumps(ok),
                    message="done",
                    verdict=json.dumps({"passed": c == "P", "checks": []}),
                    agent_meta=json.dumps({"error": "ModelServerError: down"} if c == "I" else {}),
                    duration=0.01,
                    created_at=1_700_000_000.0 + i,
                )
            )
    store.close()
    return folder


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run of the toy suite: 5 tasks of 0 to 4 required writes, 4 trials, 25% errors."""
    base = tmp_path_factory.mktemp("toy")
    suite = write_suite(base / "suite", [0, 1, 2, 3, 4])
    result = run_trials(
        suite,
        agent="simulated",
        agent_options={"error_rate": 0.25},
        trials=4,
        seed=1,
        logs=base / "logs",
        run_id="toy",
    )
    return result.folder


# --- errors ---


def test_missing_run_folder_is_named_with_the_fix_and_nothing_is_written(tmp_path: Path):
    """A folder that does not exist raises RunNotFound naming it and the fix, creating nothing."""
    missing = tmp_path / "logs" / "nope"
    with pytest.raises(RunNotFound) as err:
        load_report(missing)
    assert str(missing) in str(err.value) and "logs/<run>" in str(err.value)
    assert isinstance(err.value, hx.HarnessError) and err.value.path == missing
    assert not (tmp_path / "logs").exists()


def test_folder_without_a_store_is_not_a_run_and_gains_no_database(tmp_path: Path):
    """A folder with no harness.db raises RunNotFound and no harness.db appears in it."""
    folder = tmp_path / "empty"
    folder.mkdir()
    with pytest.raises(RunNotFound, match="has no harness.db"):
        load_report(folder)
    assert list(folder.iterdir()) == []


def test_cli_report_on_a_bad_folder_exits_2_with_the_message(tmp_path: Path):
    """`harness report` on a missing folder prints the error and exits with status 2."""
    out = CliRunner().invoke(main, ["report", str(tmp_path / "nope")])
    assert out.exit_code == 2
    assert "no run folder" in out.output and "nope" in out.output


def test_hint_lists_the_run_folders_beside_a_wrong_path(tmp_path: Path):
    """A wrong run name in logs/ is answered with the run folders that do exist there."""
    make_run(tmp_path / "logs", "real-run", {"a": "PP"})
    with pytest.raises(RunNotFound, match="real-run"):
        load_report(tmp_path / "logs" / "typo")


# --- the model ---


def test_report_counts_and_estimates_match_the_store_and_stats(toy_run: Path):
    """T, n, per-task counts and every pass^k/pass@k interval equal stats on the stored trials."""
    report = load_report(toy_run)
    store = hx.Store(toy_run / "harness.db")
    rows = store.trials("toy")
    store.close()
    ids = sorted({r.task_id for r in rows})
    succ = [sum(r.passed for r in rows if r.task_id == t) for t in ids]
    assert [t.task_id for t in report.tasks] == ids
    assert [t.successes for t in report.tasks] == succ
    assert report.n_tasks == 5 and report.n == 4 and report.n_trials == 20
    curve = stats.suite_curve(succ, [4] * 5)
    for k in range(1, 5):
        assert report.pass_hat(k) == curve.pass_hat(k)
        assert report.pass_at(k) == curve.pass_at(k)
        assert report.pass_hat(k).method in stats.INTERVAL_METHODS
    assert set(report.methods()) >= set(curve.hat_methods)


def test_null_model_horizon_and_self_conditioning_come_from_the_step_lists(tmp_path: Path):
    """p is verified steps over required steps; rows group tasks by step count; H = ln .5/ln p."""
    folder = make_run(
        tmp_path,
        "r",
        {"a": "PPPF", "b": "PFFF", "c": "PPPP"},
        steps={"a": 1, "b": 3, "c": 0},
    )
    report = load_report(folder)
    # a: 3 of 4 steps; b: 3 + 2 + 2 + 2 = 9 of 12 steps; c: no steps.
    assert report.null is not None
    assert report.null.p == stats.fit_step_success(ok=12, total=16)
    assert [(r.steps, r.n_tasks) for r in report.null.rows] == [(0, 1), (1, 1), (3, 1)]
    assert [r.observed for r in report.null.rows] == [1.0, 0.75, 0.25]
    value, _, _ = report.horizon()  # type: ignore[misc]
    assert value == pytest.approx(math.log(0.5) / math.log(12 / 16))
    sc = report.self_conditioning
    assert sc is not None and sc.clean is not None
    assert sc.n_episodes == 8  # c's episodes have no steps and carry no history
    # Clean history: a's 4 steps, b's first steps (4) and the rest of its passing trial (2).
    assert sc.clean == stats.wilson(4, 10)
    assert sc.after_error == stats.wilson(0, 6)  # b's failing trials: 2 steps after the error


def test_infra_policy_fail_counts_errors_as_failures_and_exclude_drops_them(tmp_path: Path):
    """Under fail an infra error is a failed trial; under exclude it leaves the counts."""
    folder = make_run(tmp_path, "r", {"a": "PPPI", "b": "PFIP", "c": "IIII"})
    fail = load_report(folder)
    assert [(t.successes, t.trials) for t in fail.tasks] == [(3, 4), (2, 4), (0, 4)]
    assert fail.infra_errors == 6 and fail.dropped_tasks == ()
    excl = load_report(folder, infra="exclude")
    assert [(t.task_id, t.successes, t.trials) for t in excl.tasks] == [("a", 3, 3), ("b", 2, 3)]
    assert excl.dropped_tasks == ("c",) and excl.n == 3
    expected = stats.suite_pass_hat_k([3, 2], [3, 3], 3)
    got = excl.pass_hat(3)
    assert (got.value, got.low, got.high) == pytest.approx(
        (expected.value, expected.low, expected.high)
    )
    assert fail.to_dict()["infra_policy"]["policy"] == "fail"
    assert "tau2-bench" in excl.to_dict()["infra_policy"]["description"]


def test_all_infra_errors_under_exclude_is_a_clear_error(tmp_path: Path):
    """A run whose every trial was an infra error cannot be estimated under exclude: say so."""
    folder = make_run(tmp_path, "r", {"a": "II"})
    with pytest.raises(RunNotFound, match="--infra fail"):
        load_report(folder, infra="exclude")


def test_interrupted_run_reports_k_up_to_the_smallest_trial_count(tmp_path: Path):
    """Tasks with fewer trials bound k; the heat map marks the missing trials."""
    folder = make_run(tmp_path, "r", {"a": "PPPP", "b": "PF--"})
    report = load_report(folder)
    assert (report.n, report.n_max) == (2, 4)
    assert report.curve.ks.tolist() == [1, 2]
    assert report.tasks[1].cells == ("pass", "fail", "missing", "missing")


def test_partial_credit_is_reported_beside_pass_fail_not_in_it(tmp_path: Path):
    """Partial credit is a separate mean; pass^1 counts only full passes."""
    folder = make_run(tmp_path, "r", {"a": "PF", "b": "FF"}, partial=0.5)
    report = load_report(folder)
    assert report.partial_mean == pytest.approx((1.0 + 0.5 + 0.5 + 0.5) / 4)
    assert report.partial_trials == 4
    assert report.pass_hat(1).value == pytest.approx(0.25)
    assert load_report(make_run(tmp_path, "q", {"a": "PF"}, partial=None)).partial_mean is None


def test_failures_and_outcomes_are_counted_over_all_trials(tmp_path: Path):
    """Failed tool calls by class and episodes by outcome sum over every trial."""
    folder = make_run(tmp_path, "r", {"a": "PFFI"})
    report = load_report(folder)
    assert report.failures == {"precondition": 2}
    assert report.outcomes == {"committed": 3, "failed": 1}


# --- outputs ---


def test_json_is_strict_json_with_format_version_and_policy(toy_run: Path):
    """`--json` prints strict JSON: format, version, T, n, pass^k rows, policy, evidence."""
    out = CliRunner().invoke(main, ["report", str(toy_run), "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert (data["format"], data["version"]) == (REPORT_FORMAT, 1)
    assert (data["T"], data["n"]) == (5, 4)
    assert [row["k"] for row in data["pass_hat_k"]] == [1, 2, 3, 4]
    assert {"value", "low", "high", "method"} <= set(data["pass_hat_k"][0])
    assert data["infra_policy"]["policy"] == "fail"
    assert data["evidence"]["agent"]["name"] == "simulated"
    assert data["horizon"]["s"] == 0.5 and "self_conditioning" in data


def test_terminal_report_names_policy_methods_and_every_k(toy_run: Path):
    """The terminal report shows T, n, every k, the interval methods and the infra policy."""
    out = CliRunner().invoke(main, ["report", str(toy_run), "--infra", "exclude", "--tasks"])
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "T = 5 tasks, n = 4 trials" in text
    assert "policy exclude" in text and "tau2-bench's convention" in text
    for k in range(1, 5):
        assert re.search(rf"^\s*{k} │", out.output, re.MULTILINE)
    report = load_report(toy_run)
    assert report.pass_hat(1).method in text
    assert "p^n null model" in text and "horizon at s = 0.5" in text
    assert "self-conditioning" in text and "per task" in text


def test_html_is_one_self_contained_file(toy_run: Path, tmp_path: Path):
    """`--html` writes one file with inline SVG, no script and nothing fetched from elsewhere."""
    target = tmp_path / "out" / "report.html"
    out = CliRunner().invoke(main, ["report", str(toy_run), "--html", str(target)])
    assert out.exit_code == 0, out.output
    page = target.read_text(encoding="utf-8")
    assert "<script" not in page and "<link" not in page and " src=" not in page
    assert set(re.findall(r"https?://[^\s\"'<>]+", page)) <= {"http://www.w3.org/2000/svg"}
    for ident in ("plot-passk", "plot-null", "plot-heatmap", "evidence", "infra-policy"):
        assert f'id="{ident}"' in page


def test_html_escapes_task_ids_and_evidence(tmp_path: Path):
    """Task ids and evidence values are escaped, quotes too, so a hostile id cannot inject
    markup: the page holds it only as text (heat map, task table, evidence, JSON)."""
    hostile = "<script>alert(1)</script>\"'<img onerror=x>"
    folder = make_run(tmp_path, "r", {hostile: "PF", "t": "PP"}, versions={hostile: hostile})
    page = render_html(load_report(folder))
    assert "<script" not in page and "<img" not in page and "\"'" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert unescape(page).count(hostile) >= 6


def test_html_and_terminal_cope_with_one_trial_no_steps_and_a_dropped_task(tmp_path: Path):
    """One trial per task, no required steps, no partial credit, a dropped task: still renders."""
    no_steps = {"a": 0, "b": 0, "c": 0}
    bare = make_run(tmp_path, "bare", {"a": "P", "b": "F", "c": "I"}, steps=no_steps, partial=None)
    report = load_report(bare, infra="exclude")
    assert report.null is None and report.self_conditioning is None and report.n == 1
    assert report.partial_mean is None
    page = render_html(report)
    assert 'id="plot-passk"' in page and "No task has required steps" in page
    assert "Dropped (no trials left under exclude): c" in page
    out = CliRunner().invoke(main, ["report", str(bare), "--infra", "exclude"])
    assert out.exit_code == 0 and "no task has required steps" in out.output


# Appended to a copy of the report inside the test only: the report itself carries no script.
LAYOUT_PROBE = """<script>
const boxes = {};
for (const id of ["plot-passk", "plot-null", "plot-heatmap", "evidence", "passk-table"]) {
  const r = document.getElementById(id).getBoundingClientRect();
  boxes[id] = [r.width, r.height];
}
const band = document.querySelector("#plot-passk polygon.band").getBBox();
boxes.band = [band.width, band.height];
boxes.cells = document.querySelectorAll("#plot-heatmap rect.cell").length;
const out = document.createElement("pre");
out.id = "layout";
out.textContent = JSON.stringify(boxes);
document.body.appendChild(out);
</script></body>"""


@needs_chromium
def test_html_report_renders_in_headless_chromium(toy_run: Path, tmp_path: Path):
    """Chromium lays out the three SVG plots, the band, every heat-map cell and the evidence."""
    report = load_report(toy_run)
    page = tmp_path / "report.html"
    page.write_text(render_html(report), encoding="utf-8")
    boxes, dom = layout(page, LAYOUT_PROBE, tmp_path / "profile")
    for ident in ("plot-passk", "plot-null", "plot-heatmap", "evidence", "passk-table", "band"):
        width, height = boxes[ident]
        assert width > 50 and height > 10, (ident, boxes[ident])
    assert boxes["cells"] == report.n_tasks * report.n_max
    assert dom.count('class="point"') == report.n
    assert "harness version" in dom and "agent configuration" in dom and "retry policy" in dom


# --- compare ---


def test_compare_pairs_shared_tasks_with_the_paired_interval(tmp_path: Path):
    """compare gives pass^k of each run and stats.paired_difference on the shared tasks."""
    a = make_run(tmp_path, "a", {"t1": "PPPP", "t2": "PPFF", "t3": "PFFF", "only-a": "PPPP"})
    b = make_run(tmp_path, "b", {"t1": "PPPF", "t2": "PFFF", "t3": "FFFF", "only-b": "FFFF"})
    cmp = compare_reports(load_report(a), load_report(b))
    assert cmp.tasks == ("t1", "t2", "t3")
    assert (cmp.only_a, cmp.only_b, cmp.changed) == (("only-a",), ("only-b",), ())
    assert len(cmp.rows) == 4
    for k, (ea, eb, diff) in enumerate(cmp.rows, start=1):
        assert ea == stats.suite_pass_hat_k([4, 2, 1], [4, 4, 4], k)
        assert eb == stats.suite_pass_hat_k([3, 1, 0], [4, 4, 4], k)
        assert diff == stats.paired_difference([4, 2, 1], [4] * 3, [3, 1, 0], [4] * 3, k)


def test_compare_cli_json_and_changed_task_versions(tmp_path: Path):
    """`harness compare --json` names the runs, k rows, and tasks whose version changed."""
    a = make_run(tmp_path, "a", {"t1": "PPP", "t2": "PFF"})
    b = make_run(tmp_path, "b", {"t1": "PP", "t2": "FF"}, versions={"t2": "2"})
    out = CliRunner().invoke(main, ["compare", str(a), str(b), "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert (data["a"]["run"], data["b"]["run"]) == ("a", "b")
    assert [r["k"] for r in data["rows"]] == [1, 2]
    assert data["rows"][0]["difference"]["method"] == "mover-t-hull"
    assert data["changed"] == ["t2"]
    text = CliRunner().invoke(main, ["compare", str(a), str(b)]).output
    assert "A - B" in text and "changed between the runs" in text


def test_compare_against_a_run_not_finished_says_so_and_which_k_were_cut(tmp_path: Path):
    """A run still in progress (or interrupted) is compared on the trials it has, and
    `harness compare` says which run is not finished and which k of the planned ones it cannot
    give; a comparison of two finished runs says neither."""
    a = make_run(tmp_path, "a", {"t1": "PPPPPP", "t2": "PPFPPP"})
    b = make_run(tmp_path, "b", {"t1": "PPPP--", "t2": "PPP---"}, status="running", trials=6)
    out = CliRunner().invoke(main, ["compare", str(a), str(b)], env={"COLUMNS": "120"})
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "run B (b) is running, not finished" in text
    assert "k = 4..6 not compared" in text and "planned for up to 6 trials a task" in text
    assert "run A" not in text
    data = json.loads(CliRunner().invoke(main, ["compare", str(a), str(b), "--json"]).output)
    assert data["unfinished"] == ["b"] and data["cut_k"] == [4, 5, 6]
    assert (data["a"]["status"], data["b"]["status"]) == ("finished", "running")
    assert (data["a"]["planned_trials"], data["b"]["planned_trials"]) == (6, 6)
    assert [r["k"] for r in data["rows"]] == [1, 2, 3]

    c = make_run(tmp_path, "c", {"t1": "PPPPPP", "t2": "PFPPPP"})
    same = CliRunner().invoke(main, ["compare", str(a), str(c), "--json"]).output
    assert json.loads(same)["unfinished"] == [] and json.loads(same)["cut_k"] == []
    text = CliRunner().invoke(main, ["compare", str(a), str(c)]).output
    assert "not finished" not in text and "not compared" not in text


def test_compare_without_shared_tasks_is_an_error(tmp_path: Path):
    """Runs with no task in common cannot be paired: exit 2 with the reason."""
    a = make_run(tmp_path, "a", {"x": "PP"})
    b = make_run(tmp_path, "b", {"y": "PP"})
    out = CliRunner().invoke(main, ["compare", str(a), str(b)])
    assert out.exit_code == 2 and "share no task" in out.output

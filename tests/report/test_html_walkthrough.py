"""The HTML report as a place: every cell of the per-task grid opens its trial's timeline, the
trials are listed failed first with a filter by failure class, and recorded strings stay text."""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from click.testing import CliRunner
from markupsafe import Markup

import harness as hx
from harness.agents import SimulatedAgent
from harness.audit import timeline
from harness.audit.html import render_report, trial_page
from harness.cli import main
from harness.report import load_report, render_html
from harness.report.html import INFRASTRUCTURE, PASSED, TrialPages
from harness.runs.judge import trial_class
from harness.runs.layout import open_store
from harness.runs.start import run_trials
from harness.store import TrialRow

from ..audit.test_audit import hostile_timeline
from ..browser import layout, needs_chromium
from ..toy_env import write_suite
from .test_report import make_run

CAUSE = "ModelServerError: cannot reach the server: connection refused"


class DownOnOddSeeds:
    """The simulated agent, except that the model server is down for task t3 on odd seeds."""

    name = "down-on-odd-seeds"

    def __init__(self) -> None:
        self.inner = SimulatedAgent(error_rate=0.35)

    def config(self) -> dict[str, Any]:
        return {"name": self.name}

    def run(self, task: Any, toolbox: Any, *, seed: int) -> Any:
        if task.id == "t3" and seed % 2:
            raise hx.ModelServerError(
                "cannot reach the server: connection refused", url="localhost:9"
            )
        return self.inner.run(task, toolbox, seed=seed)


@pytest.fixture(scope="module")
def flaky_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A toy run of 4 tasks by 4 trials: wrong writes, precondition failures, passes, and
    trials the model server was down for."""
    base = tmp_path_factory.mktemp("walk")
    suite = write_suite(base / "suite", [1, 2, 3, 2])
    result = run_trials(
        suite, agent=DownOnOddSeeds(), trials=4, seed=3, logs=base / "logs", run_id="walk"
    )
    return result.folder


def trials_of(folder: Path) -> dict[str, dict[str, Any]]:
    """Every trial of the run by episode id: its row's state and its timeline."""
    with open_store(folder) as opened:
        store = opened.store
        episodes = {e.id: e for e in store.episodes("walk")}
        out = {}
        for row in store.trial_rows("walk"):
            t = timeline(store, episodes[row.episode_id], row)
            state = "infra" if row.infra_error else ("pass" if row.passed else "fail")
            classes = {e["failure_class"] for e in t["events"] if e.get("failure_class")}
            fields = [
                f"{key}{field}"
                for e in t["events"]
                if e["kind"] == "transaction"
                for key, change in (e.get("diff") or {}).items()
                for field in change["fields"]
            ]
            failed = trial_class(row)
            out[row.episode_id] = {
                "state": state,
                "classes": classes,
                "fields": fields,
                "class": PASSED if failed is None else failed.cls,
            }
    return out


def write_page(folder: Path, target: Path) -> str:
    """`harness report RUN --html target`, and the page it wrote."""
    result = CliRunner().invoke(main, ["report", str(folder), "--html", str(target)])
    assert result.exit_code == 0, result.output
    return target.read_text(encoding="utf-8")


def test_the_fixture_run_has_every_kind_of_trial(flaky_run: Path):
    """The run behind these tests has passes, failures with field-level diffs, precondition
    failures and infrastructure failures, so the tests below cannot pass on an empty case."""
    trials = trials_of(flaky_run).values()
    assert {t["state"] for t in trials} == {"pass", "fail", "infra"}
    assert any(t["state"] == "fail" and t["fields"] for t in trials)
    assert any("precondition" in t["classes"] for t in trials)


def test_every_grid_cell_links_to_its_trials_page_and_failures_come_first(
    flaky_run: Path, tmp_path: Path
):
    """`harness report --html` links each heat-map cell to a page holding that trial's episode;
    the trial list holds every trial, failed ones before infrastructure errors before passes;
    the file is still one page with nothing loaded from elsewhere."""
    page = write_page(flaky_run, tmp_path / "report.html")
    trials = trials_of(flaky_run)
    links = re.findall(r'<a class="trial-link" href="#([^"]+)">', page)
    assert len(links) == len(trials) == 16
    for href, episode in zip(sorted(links), sorted(f"episode-{e}" for e in trials), strict=True):
        assert href == episode and page.count(f'id="{episode}"') == 1
    listed = re.findall(r'<tr class="(pass|fail|infra) [^"]*">.*?href="#episode-([^"]+)"', page)
    assert [e for _, e in listed] != sorted(e for _, e in listed)  # failures moved up
    states = [state for state, _ in listed]
    assert states == sorted(states, key=["fail", "infra", "pass"].index)
    assert {e: s for s, e in listed} == {e: t["state"] for e, t in trials.items()}
    assert "<link" not in page and " src=" not in page and "url(" not in page
    assert not re.search(r"href=\"(?!#)", page) and page.count("href=") > 2 * len(trials)


def test_trial_rows_name_their_failure_classes_and_infrastructure_cause(
    flaky_run: Path, tmp_path: Path
):
    """Each row carries the filter class of its trial's class (one a trial: passed,
    infrastructure, or why it failed) and names its calls' failure classes; an infrastructure
    failure's row and timeline name its cause."""
    page = write_page(flaky_run, tmp_path / "report.html")
    names = dict(re.findall(r'id="fc-(\d+)" value="([^"]+)"', page))
    rows = re.findall(r'<tr class="(?:pass|fail|infra) ([^"]*)">(.*?)</tr>', page)
    trials = trials_of(flaky_run)
    seen = set()
    for classes, cells in rows:
        (episode,) = re.findall(r'href="#episode-([^"]+)"', cells)
        trial = trials[episode]
        assert [names[c.removeprefix("fc-")] for c in classes.split()] == [trial["class"]]
        assert (trial["class"] == INFRASTRUCTURE) == (trial["state"] == "infra")
        assert all(c in cells for c in trial["classes"])
        assert (CAUSE in cells) == (trial["state"] == "infra")
        section = page.split(f'id="episode-{episode}">', 1)[1].split("</section>\n</section>")[0]
        shown = f"infrastructure failure (not the agent's): <code>{CAUSE}</code>"
        assert (shown in section) == (trial["state"] == "infra")
        seen.add(episode)
    assert seen == set(trials)


def test_without_the_record_the_report_has_no_trial_pages(flaky_run: Path):
    """`render_html(report)` alone is the report as before: no links, no trial list."""
    page = render_html(load_report(flaky_run))
    assert 'class="trial-link"' not in page and 'id="trials"' not in page
    assert "trial-page" not in page


def test_report_with_trial_pages_escapes_every_recorded_string(tmp_path: Path):
    """Task and episode ids, failure classes, the infrastructure cause, check names and the
    timeline's actions, arguments and diffs come out escaped, in text and in attributes, and
    the grid's links and the page ids still match."""
    hostile = "<script>alert(1)</script>\"'<img onerror=x>"
    folder = make_run(tmp_path, "r", {hostile: "FI", "t": "PP"})
    report = load_report(folder)
    pages = []
    for trial in (0, 1):
        row = TrialRow(
            id=f"r-{hostile}-{trial}",
            run_id="r",
            task_id=hostile,
            trial=trial,
            seed=0,
            episode_id=f"r-{hostile}-{trial}",
            passed=False,
            infra_error=trial == 1,
            agent_meta=json.dumps({"error": hostile}),
            created_at=0.0,
        )
        t = {**hostile_timeline(hostile), "episode_id": row.episode_id, "trial": trial}
        pages.append(trial_page(t, row))
    page = render_html(report, pages=TrialPages(tuple(pages), Markup("")))
    assert "<script" not in page and "<img" not in page and "\"'" not in page
    assert unescape(page).count(hostile) >= 30
    hrefs = re.findall(r'href="#(episode-[^"]+)"', page)
    ids = {unescape(i) for i in re.findall(r'id="(episode-[^"]+)"', page)}
    assert len(ids) == 2 and {unquote(h) for h in hrefs} == ids
    assert all("<" not in h and '"' not in h for h in hrefs)


def test_the_html_option_writes_what_render_report_renders(flaky_run: Path, tmp_path: Path):
    """The command writes `render_report(load_report(RUN))`: one code path for the page."""
    page = write_page(flaky_run, tmp_path / "report.html")
    assert page == render_report(load_report(flaky_run))


# Appended to a copy of the page inside the test only: the report itself carries no script.
# It filters the trial list by each failure class, then follows every failed trial's link
# from the grid and reads the page the browser shows.
WALK_PROBE = """<script>
const out = {filters: {}, failed: []};
// checkVisibility: false under display: none and inside a closed <details>.
const visible = el => el.checkVisibility();
const rows = () => Array.from(document.querySelectorAll("#trial-table tbody tr"))
  .filter(visible).map(tr => tr.querySelector("a").getAttribute("href").slice(1));
for (const input of document.querySelectorAll("#trial-filter input")) {
  input.click();
  out.filters[input.value === "on" ? "all" : input.value] = rows();
}
document.getElementById("fc-all").click();
for (const rect of document.querySelectorAll("#plot-heatmap rect.cell-fail")) {
  const link = rect.closest("a");
  link.dispatchEvent(new MouseEvent("click", {bubbles: true, cancelable: true}));
  const page = document.querySelector(":target");
  const seen = {hash: decodeURIComponent(location.hash), target: page && page.id};
  if (page) {
    seen.shown = visible(page);
    seen.grid_hidden = !visible(document.getElementById("plot-heatmap"));
    seen.text = page.innerText;
    seen.verdict = page.querySelector(".verdict").innerText;
    seen.fields = Array.from(page.querySelectorAll("ul.fields li"), li => li.innerText);
    const details = page.querySelector("table.diff details");
    if (details) {
      const before = details.querySelector("td.before");
      seen.before_hidden = !visible(before);
      details.querySelector("summary").click();
      seen.before_shown = visible(before) && visible(details.querySelector("td.after"));
    }
  }
  out.failed.push(seen);
}
const pre = document.createElement("pre");
pre.id = "layout";
pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script></body>"""


@needs_chromium
def test_following_a_grid_cell_in_chromium_shows_the_failed_trials_timeline(
    flaky_run: Path, tmp_path: Path
):
    """In Chromium, each failed cell of the grid opens a page, alone on screen, with its episode
    id, the failed verdict and its field-level diff lines, the whole before and after one click
    further; and the failure-class filter shows exactly the trials of the class chosen."""
    target = tmp_path / "report.html"
    write_page(flaky_run, target)
    measured, _ = layout(target, WALK_PROBE, tmp_path / "profile")
    trials = trials_of(flaky_run)
    failed = sorted(e for e, t in trials.items() if t["state"] == "fail")
    assert [s["target"] for s in measured["failed"]] == [f"episode-{e}" for e in failed]
    with_diff = 0
    for seen, episode in zip(measured["failed"], failed, strict=True):
        assert seen["hash"] == f"#episode-{episode}" and seen["shown"] and seen["grid_hidden"]
        assert f"episode {episode}" in seen["text"]
        assert seen["verdict"].startswith("verifier: failed")
        assert seen["fields"] == trials[episode]["fields"]
        if seen["fields"]:
            with_diff += 1
            assert seen["before_hidden"] and seen["before_shown"], seen
    assert with_diff >= 1
    filters = measured["filters"]
    assert sorted(filters["all"]) == sorted(f"episode-{e}" for e in trials)
    for name, shown in filters.items():
        if name == "all":
            continue
        expected = {f"episode-{e}" for e, t in trials.items() if t["class"] == name}
        assert set(shown) == expected and 0 < len(shown) < len(trials), name
    assert {PASSED, INFRASTRUCTURE} <= set(filters)
    assert sum(len(shown) for name, shown in filters.items() if name != "all") == len(trials)

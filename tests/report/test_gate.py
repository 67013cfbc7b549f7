"""Gating CI on a report: --fail-under bars, the k table's subset, infrastructure causes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlmodel import select

import harness as hx
from harness.cli import main
from harness.report import load_report, render_html
from harness.report.gate import EXIT_BELOW_BAR, EXIT_INFRA, Bar, exit_status, judge
from harness.report.model import PLANNED_CAUSE, table_ks
from harness.store import TrialRow

from .test_report import make_run


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four tasks of four trials: 13 of 16 pass, no infrastructure error."""
    logs = tmp_path_factory.mktemp("gate")
    return make_run(logs, "mixed", {"a": "PPPP", "b": "PPPP", "c": "PPPF", "d": "PFPF"})


def report_cli(*args: str) -> tuple[int, str]:
    """Run `harness report` with ``args``; its exit status and output."""
    out = CliRunner().invoke(main, ["report", *args])
    return out.exit_code, out.output


# --- parsing bars ---


def test_a_bar_reads_metric_k_and_value():
    """pass^4=0.8 and pass@1=0.95 parse, spaces allowed, and print back as written."""
    assert Bar.parse("pass^4=0.8") == Bar("^", 4, 0.8)
    assert Bar.parse(" pass@1 = 0.95 ") == Bar("@", 1, 0.95)
    assert str(Bar.parse("pass^10=1")) == "pass^10=1"
    assert Bar.parse("pass@2=0").metric == "pass@2"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("pass^4", 'is not METRIC=VALUE: write it as --fail-under "pass^4=0.8"'),
        ("accuracy=0.8", "unknown metric 'accuracy'"),
        ("passk4=0.8", "use pass^K (all of K trials pass) or pass@K"),
        ("pass^=0.8", "k in 'pass^' must be a whole number >= 1"),
        ("pass^0=0.8", "k in 'pass^0' must be a whole number >= 1"),
        ("pass@x=0.8", "k in 'pass@x' must be a whole number >= 1, e.g. pass@4"),
        ("pass^4=80", "must be a number from 0 to 1 (0.8, not 80%)"),
        ("pass^4=-0.1", "must be a number from 0 to 1"),
        ("pass^4=high", "must be a number from 0 to 1"),
        ("pass^4=nan", "must be a number from 0 to 1"),
    ],
)
def test_bad_bars_are_refused_with_the_fix(text: str, message: str):
    """Bad syntax, an unknown metric, a bad k or a value outside [0, 1] names the fix."""
    with pytest.raises(ValueError) as err:
        Bar.parse(text)
    assert message in str(err.value)


def test_a_k_beyond_the_trials_names_both_and_the_fix():
    """k = 8 with 4 trials per task is refused: lower k or run with --trials 8."""
    Bar.parse("pass^4=0.5").check_k(4)
    with pytest.raises(
        ValueError,
        match=r"at least 8 trials per task and the run has 4: lower k "
        r"to at most 4, or run with --trials 8",
    ):
        Bar.parse("pass^8=0.5").check_k(4)


# --- judging ---


def test_lower_bound_and_point_estimate_judge_the_same_bar_differently(mixed: Path):
    """A bar between the interval's lower bound and the estimate fails on lower, passes on point."""
    report = load_report(mixed)
    est = report.pass_hat(2)
    bar = Bar("^", 2, round((est.low + est.value) / 2, 3))
    (on_lower,) = judge(report, [bar], "lower")
    (on_point,) = judge(report, [bar], "point")
    assert on_lower.figure == est.low and not on_lower.passed
    assert on_point.figure == est.value and on_point.passed
    assert "lower bound" in on_lower.describe() and "BELOW THE BAR" in on_lower.describe()
    assert "estimate" in on_point.describe() and on_point.describe().endswith(": ok")
    assert exit_status(report, [on_lower]) == EXIT_BELOW_BAR
    assert exit_status(report, [on_point]) == 0


def test_pass_at_k_bars_use_pass_at_k(mixed: Path):
    """A pass@k bar is judged on pass@k, not pass^k."""
    report = load_report(mixed)
    (j,) = judge(report, [Bar("@", 3, 0.0)], "point")
    assert j.estimate.value == report.pass_at(3).value != report.pass_hat(3).value


def test_cli_report_passes_and_fails_its_bars(mixed: Path):
    """`harness report --fail-under` exits 0 when every bar holds, 1 when one is below."""
    report = load_report(mixed)
    low = report.pass_hat(1).low
    code, text = report_cli(str(mixed), "--fail-under", f"pass^1={low - 0.01:.3f}")
    assert code == 0, text
    assert "judged on the lower bound of the interval" in text
    assert f"lower bound {low:.3f} >= {low - 0.01:.3f}: ok" in text
    code, text = report_cli(
        str(mixed), "--fail-under", "pass^1=0.1", "--fail-under", f"pass^1={low + 0.01:.3f}"
    )
    assert code == EXIT_BELOW_BAR, text
    assert ": ok" in text and "BELOW THE BAR" in text


def test_cli_report_judges_the_point_estimate_when_asked(mixed: Path):
    """--fail-under-on point compares the estimate, and says so."""
    report = load_report(mixed)
    value = report.pass_hat(4).value
    bar = f"pass^4={value - 0.01:.3f}"
    assert report_cli(str(mixed), "--fail-under", bar)[0] == EXIT_BELOW_BAR
    code, text = report_cli(str(mixed), "--fail-under", bar, "--fail-under-on", "point")
    assert code == 0, text
    assert "judged on the point estimate" in text and f"estimate {value:.3f} >=" in text


def test_cli_report_json_carries_the_verdicts(mixed: Path):
    """With --json the verdicts are in the JSON, with the basis and the figure compared."""
    code, text = report_cli(str(mixed), "--json", "--fail-under", "pass^2=0.99")
    assert code == EXIT_BELOW_BAR
    (verdict,) = json.loads(text)["fail_under"]
    assert verdict["bar"] == "pass^2=0.99" and verdict["basis"] == "lower"
    assert verdict["passed"] is False and verdict["figure"] == verdict["estimate"]["low"]


@pytest.mark.parametrize(
    ("bar", "message"),
    [
        ("pass^5=0.5", "pass^5=0.5 needs at least 5 trials per task and the run has 4"),
        ("pass@4", "is not METRIC=VALUE"),
        ("f1=0.5", "unknown metric 'f1'"),
    ],
)
def test_cli_report_bad_bars_are_usage_errors(mixed: Path, bar: str, message: str):
    """A bad bar, or a k beyond the run's trials, is a usage error (exit 2) naming the fix."""
    code, text = report_cli(str(mixed), "--fail-under", bar)
    assert code == 2
    assert "--fail-under" in text and message in " ".join(text.split())


# --- the k table ---


def test_the_k_table_shows_one_to_ten_the_powers_of_two_and_n():
    """k = 1..10, then powers of two, then n; every k with all_k or n <= 10."""
    assert table_ks(4) == [1, 2, 3, 4]
    assert table_ks(10) == list(range(1, 11))
    assert table_ks(300) == [*range(1, 11), 16, 32, 64, 128, 256, 300]
    assert table_ks(64) == [*range(1, 11), 16, 32, 64]
    assert table_ks(300, all_k=True) == list(range(1, 301))


def test_report_prints_the_subset_and_all_k_prints_every_row(tmp_path: Path):
    """With 40 trials the terminal shows 14 rows and says so; --all-k shows 40; JSON has 40."""
    folder = make_run(tmp_path, "long", {"a": "P" * 40, "b": "PF" * 20})
    rows = re.compile(r"^\s*(\d+) │", re.MULTILINE)
    code, text = report_cli(str(folder))
    assert code == 0, text
    assert [int(k) for k in rows.findall(text)] == [*range(1, 11), 16, 32, 40]
    assert "--all-k shows all 40" in " ".join(text.split())
    code, text = report_cli(str(folder), "--all-k")
    assert [int(k) for k in rows.findall(text)] == list(range(1, 41))
    data = json.loads(report_cli(str(folder), "--json")[1])
    assert len(data["pass_hat_k"]) == 40


def test_the_html_table_and_compare_show_the_subset_too(tmp_path: Path):
    """The HTML report's pass^k table and `harness compare` show k = 1..10, the powers of two
    and n as the terminal does, and every k with --all-k."""
    folder = make_run(tmp_path, "long", {"a": "P" * 40, "b": "PF" * 20})
    html_rows = re.compile(r'<tr><td class="num">(\d+)</td><td class="num">')

    def table(html: str) -> list[int]:
        part = html.split('<table id="passk-table">', 1)[1].split("</table>", 1)[0]
        return [int(k) for k in html_rows.findall(part)]

    for extra, expected in (((), [*range(1, 11), 16, 32, 40]), (("--all-k",), list(range(1, 41)))):
        out = tmp_path / f"r{len(extra)}.html"
        code, text = report_cli(str(folder), "--html", str(out), *extra)
        assert code == 0, text
        assert table(out.read_text()) == expected
        result = CliRunner().invoke(main, ["compare", str(folder), str(folder), *extra])
        assert result.exit_code == 0, result.output
        compared = re.findall(r"^\s*(\d+) │ \d\.\d{3}", result.output, re.MULTILINE)
        assert [int(k) for k in compared] == expected
        assert ("--all-k shows all 40" in " ".join(result.output.split())) == (not extra)


# --- infrastructure failures ---


def test_infrastructure_causes_are_shown_in_the_terminal_json_and_html(tmp_path: Path):
    """Each infra-failed trial's cause appears, grouped, in the terminal, JSON and HTML report."""
    folder = make_run(tmp_path, "infra", {"a": "PIPP", "b": "PPIP"})
    report = load_report(folder)
    assert [(f.task_id, f.trial, f.cause) for f in report.infra_failures] == [
        ("a", 1, "ModelServerError: down"),
        ("b", 2, "ModelServerError: down"),
    ]
    assert not report.infra_dominates and report.trials_run == 8
    code, text = report_cli(str(folder))
    assert code == 0
    flat = " ".join(text.split())
    assert "infrastructure failures: 2 of 8 trials" in flat
    assert "2 x ModelServerError: down" in flat and "a trial 1, b trial 2" in flat
    data = json.loads(report_cli(str(folder), "--json")[1])["infra_policy"]
    assert data["dominates"] is False
    assert data["failures"][0] == {
        "task_id": "a",
        "trial": 1,
        "episode_id": "infra-a-1",
        "cause": "ModelServerError: down",
        "planned": False,
    }
    page = render_html(report)
    assert 'id="infra-causes"' in page and "ModelServerError: down" in page


def test_dominating_infrastructure_failures_fail_the_gate(tmp_path: Path):
    """More than half of the trials failing for infrastructure exits 3 whatever the bars say."""
    folder = make_run(tmp_path, "down", {"a": "IIIP", "b": "IIPP"})
    report = load_report(folder)
    assert report.infra_dominates and report.infra_errors == 5
    assert exit_status(report, judge(report, [Bar("^", 1, 0.0)])) == EXIT_INFRA
    code, text = report_cli(str(folder), "--fail-under", "pass^1=0")
    assert code == EXIT_INFRA
    assert "infrastructure failures: 5 of 8 trials (more than half" in " ".join(text.split())
    # Without a bar, reading a report is not a gate: it exits 0.
    assert report_cli(str(folder))[0] == 0
    # Exactly half does not dominate.
    half = load_report(make_run(tmp_path, "half", {"a": "IIPP"}))
    assert not half.infra_dominates


def test_planned_interruptions_are_shown_but_do_not_dominate(tmp_path: Path):
    """A fault plan's announced interruptions were asked for: shown, never a reason to exit 3."""
    folder = make_run(tmp_path, "planned", {"a": "IIIP"})
    store = hx.Store(folder / "harness.db")
    with store.session() as s:
        for row in s.exec(select(TrialRow)).all():
            if row.infra_error:
                row.agent_meta = json.dumps({"interruption": "planned"})
                s.add(row)
        s.commit()
    store.close()
    report = load_report(folder)
    assert report.infra_errors == 3 and not report.infra_dominates
    assert {f.cause for f in report.infra_failures} == {PLANNED_CAUSE}
    assert all(f.to_dict()["planned"] for f in report.infra_failures)

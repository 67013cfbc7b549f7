"""The pytest plugin: pass^k as a verdict over repeated trials, and the harness fixtures."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

from harness.stats import clopper_pearson, pass_hat_k, wilson
from harness.testing.plugin import passk_estimate, trials_needed

pytest_plugins = ["pytester"]

# Plugins unrelated to these tests: pytester forgets the modules each inline run imports, so
# hypothesis's plugin would import hypothesis afresh (about a second) in every run.
QUIET = ("-p", "no:hypothesispytest", "-p", "no:cov")


def esc(text: str) -> str:
    """``text`` as a literal fnmatch pattern (square brackets are pattern syntax there)."""
    return text.replace("[", "[[]")


def test_plugin_is_registered_through_the_pytest11_entry_point():
    """The installed distribution declares harness.testing.plugin under pytest11."""
    found = [e for e in entry_points(group="pytest11") if e.name == "harness"]
    assert [e.value for e in found] == ["harness.testing.plugin"]


def test_estimate_is_unbiased_pass_k_inside_the_interval_for_p_raised_to_k():
    """The point is C(c,k)/C(n,k); the bounds are the Wilson (or CP) bounds for p, to the k."""
    est = passk_estimate(7, 8, 2)
    base = wilson(7, 8)
    assert est.value == pass_hat_k(8, 7, 2) == pytest.approx(0.75)
    assert (est.low, est.high) == (base.low**2, base.high**2)
    assert est.method == "wilson^k" and est.k == 2 and est.n_trials == 8
    cp = passk_estimate(3, 8, 4, method="clopper-pearson")
    assert cp.value == 0.0 and cp.low == 0.0  # fewer passes than k: the estimate is 0
    assert cp.high == clopper_pearson(3, 8).high ** 4


def test_trials_needed_is_the_smallest_all_passing_count_that_clears_min():
    """trials_needed(k, min) all passing clears min; one fewer does not; min=1 never does."""
    need = trials_needed(4, 0.9)
    assert passk_estimate(need, need, 4).low >= 0.9 > passk_estimate(need - 1, need - 1, 4).low
    assert trials_needed(1, 1.0) == 0


def test_passing_test_passes_and_the_summary_prints_estimate_and_interval(
    pytester: pytest.Pytester,
):
    """A test that always passes clears a modest bar; the summary shows pass^k and its interval."""
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.passk(trials=20, k=2, min=0.5)
        def test_always():
            assert True
        """
    )
    result = pytester.runpytest(*QUIET)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "*pass^k*",
            "*test_always: 20/20 trials passed "
            + esc("[PPPPPPPPPPPPPPPPPPPP]; pass^2 = 1.000, 95% interval [0.7")
            + "*"
            + esc(", 1.000] (wilson^k); min 0.5: ok"),
        ]
    )


def test_eight_passing_trials_cannot_show_pass4_of_090_and_the_failure_says_so(
    pytester: pytest.Pytester,
):
    """passk(trials=8, k=4, min=0.9) fails even at 8/8: the message names the trials needed."""
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.passk(trials=8, k=4, min=0.9)
        def test_agent():
            assert True
        """
    )
    result = pytester.runpytest(*QUIET)
    result.assert_outcomes(failed=1)
    need = trials_needed(4, 0.9)
    result.stdout.fnmatch_lines(
        [
            esc("pass^4 = 1.000, 95% interval [0.2")
            + "*"
            + esc(", 1.000] (wilson^k): the lower bound is under min=0.9"),
            "*8/8 trials passed: PPPPPPPP",
            f"*that needs at least {need} trials, all passing",
        ]
    )


def test_flaky_test_fails_with_its_estimate_and_first_failing_trial(pytester: pytest.Pytester):
    """A test failing every third trial fails the bar, printing the estimate and the failure."""
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.passk(trials=9, k=2, min=0.5)
        def test_flaky(harness_trial):
            assert harness_trial % 3 != 1, f"wrong answer in trial {harness_trial}"
        """
    )
    result = pytester.runpytest(*QUIET)
    result.assert_outcomes(failed=1)
    est = passk_estimate(6, 9, 2)
    result.stdout.fnmatch_lines(
        [
            esc(f"pass^2 = {est.value:.3f}, 95% interval [{est.low:.3f}, {est.high:.3f}]") + "*",
            "*6/9 trials passed: PFPPFPPFP",
            "*trial 1 failed: AssertionError: wrong answer in trial 1*",
            "*first failing trial (1):*",
        ]
    )


def test_each_trial_gets_fresh_fixtures_an_episode_and_its_index(pytester: pytest.Pytester):
    """Function fixtures are rebuilt per trial: a new episode, store and clock, and the index."""
    pytester.makepyfile(
        """
        import pytest
        import harness as hx

        SEEN = []

        @pytest.mark.passk(trials=4, k=1, min=0.0)
        def test_trials(harness_episode, harness_store, harness_state, fake_clock, harness_trial):
            assert harness_episode.store is harness_store
            assert harness_episode.state is harness_state and len(harness_state) == 0
            assert harness_episode.clock is fake_clock and fake_clock.now() == 0.0
            harness_state["c/x"] = harness_trial
            fake_clock.advance(5)
            SEEN.append((harness_trial, harness_episode.id, str(harness_store.url)))

        def test_after():
            assert [t for t, _, _ in SEEN] == [0, 1, 2, 3]
            assert len({e for _, e, _ in SEEN}) == 4 and len({u for _, _, u in SEEN}) == 4
        """
    )
    result = pytester.runpytest(*QUIET)
    result.assert_outcomes(passed=2)


def test_harness_episode_runs_actions_as_transactions_in_the_store(pytester: pytest.Pytester):
    """An action called in a test using harness_episode commits and is recorded."""
    pytester.makepyfile(
        """
        import harness as hx

        @hx.action(writes=["c/{name}"])
        def bump(name: str) -> int:
            state = hx.current_episode().state
            state[f"c/{name}"] = state.get(f"c/{name}", 0) + 1
            return state[f"c/{name}"]

        def test_bump(harness_episode, harness_store, harness_trial):
            assert harness_trial == 0
            assert bump("a") == 1
            txns = harness_store.transactions(harness_episode.id)
            assert [(t.action, t.status) for t in txns] == [("bump", "committed")]
        """
    )
    result = pytester.runpytest(*QUIET)
    result.assert_outcomes(passed=1)


def test_a_skip_inside_a_trial_skips_the_test(pytester: pytest.Pytester):
    """pytest.skip in a trial ends the trials and reports the test as skipped."""
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.passk(trials=5, k=1, min=0.5)
        def test_skips():
            pytest.skip("no model server")
        """
    )
    result = pytester.runpytest("-rs", *QUIET)
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*no model server*"])


def test_a_fixture_error_is_reported_as_an_error(pytester: pytest.Pytester):
    """A fixture that fails to set up is an error, not a low pass^k."""
    pytester.makepyfile(
        """
        import pytest

        @pytest.fixture
        def broken():
            raise RuntimeError("cannot connect")

        @pytest.mark.passk(trials=5, k=1, min=0.5)
        def test_uses(broken):
            pass
        """
    )
    result = pytester.runpytest(*QUIET)
    result.assert_outcomes(errors=1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ("trials=4, k=5, min=0.5", "k must be a whole number in 1..trials=4"),
        ("k=1, min=0.5", "missing 'trials'"),
        ("trials=4, k=1, min=1.5", "min must lie in [[]0, 1[]]"),
        ("trials=4, k=1, min=0.5, methd='wilson'", "unknown argument 'methd'"),
        ("4, 1, 0.5", "give its settings by keyword"),
    ],
)
def test_bad_marker_arguments_stop_the_session_with_the_reason(
    pytester: pytest.Pytester, args: str, message: str
):
    """A passk marker with bad settings is a usage error naming the test and the argument."""
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.passk({args})
        def test_bad():
            pass
        """
    )
    result = pytester.runpytest(*QUIET)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*test_bad: @pytest.mark.passk: {message}*"])


def test_passk_results_go_to_junit_user_properties(pytester: pytest.Pytester):
    """The estimate is attached to the report's user properties (junitxml shows them)."""
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.passk(trials=3, k=1, min=0.0)
        def test_props():
            pass
        """
    )
    result = pytester.runpytest("--junitxml=out.xml", *QUIET)
    result.assert_outcomes(passed=1)
    xml = (pytester.path / "out.xml").read_text()
    assert 'name="passk"' in xml and "wilson^k" in xml


def test_k_defaults_to_one_and_min_to_one_half(pytester: pytest.Pytester):
    """passk(trials=n) judges pass^1 against 0.5: 20/20 clears it, 10/20 does not."""
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.passk(trials=20)
        def test_always():
            pass

        @pytest.mark.passk(trials=20)
        def test_half(harness_trial):
            assert harness_trial % 2 == 0
        """
    )
    result = pytester.runpytest(*QUIET)
    result.assert_outcomes(passed=1, failed=1)
    half = passk_estimate(10, 20, 1)
    assert half.low < 0.5 < passk_estimate(20, 20, 1).low
    result.stdout.fnmatch_lines(
        [
            "*test_always: 20/20 trials passed*pass^1 = 1.000*min 0.5: ok",
            "*test_half: 10/20 trials passed*pass^1 = 0.500*min 0.5: FAILED*",
        ]
    )


def test_async_tests_run_each_trial_in_an_event_loop(pytester: pytest.Pytester):
    """An async def test's trials are awaited: passing ones pass, failing ones fail, as counted."""
    pytester.makepyfile(
        """
        import asyncio
        import pytest

        @pytest.mark.passk(trials=6, k=1, min=0.0)
        async def test_async_flaky(harness_trial, harness_episode):
            await asyncio.sleep(0)
            assert asyncio.get_running_loop() is not None
            assert harness_trial % 3 != 2, "third trial fails"

        @pytest.mark.passk(trials=4, k=2, min=0.1)
        async def test_async_always():
            await asyncio.sleep(0)
        """
    )
    result = pytester.runpytest(*QUIET)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "*test_async_flaky: 4/6 trials passed " + esc("[PPFPPF]") + "*",
            "*test_async_always: 4/4 trials passed " + esc("[PPPP]") + "*",
        ]
    )
    assert "not natively supported" not in result.stdout.str()

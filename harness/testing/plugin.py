"""pytest plugin: pass^k as a test verdict, and fixtures for testing tools and agents.

Registered through the ``pytest11`` entry point ``harness``, so it loads wherever harness is
installed. A test marked ``passk`` runs as repeated trials, each with fresh function-scoped
fixtures, and passes only when the *lower bound* of the interval for pass^k clears ``min``::

    @pytest.mark.passk(trials=8, k=4, min=0.9)
    def test_agent_cancels_the_order(harness_episode, harness_trial): ...

``trials`` is required; ``k`` defaults to 1 and ``min`` to 0.5, so ``passk(trials=20)`` asks
that the test passes more often than not, with 95% confidence. An ``async def`` test runs each
trial in a fresh event loop (``asyncio.run``) unless another plugin (pytest-asyncio, anyio)
already runs it.

The estimate is the unbiased ``C(c, k) / C(n, k)`` for ``c`` passing trials of ``n``; the
interval is the Wilson interval for the per-trial success probability ``p`` (Clopper-Pearson
with ``method="clopper-pearson"``), raised to the k-th power: ``p^k`` is increasing in ``p``, so
it covers ``p^k`` exactly as often as the interval for ``p`` covers ``p``. A small number of
trials cannot show a high pass^k, and the failure message says how many trials could.

Fixtures: ``harness_store`` (a fresh :class:`~harness.Store` in ``tmp_path``), ``fake_clock``
(:class:`harness.testing.FakeClock`), ``harness_state`` (an empty :class:`~harness.DictState`),
``harness_episode`` (an entered :class:`~harness.Episode` over that state, store and clock) and
``harness_trial`` (the 0-based trial index under ``passk``, else 0).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _pytest.runner import runtestprotocol  # not public; pytest-rerunfailures relies on it too
from pytest import TestReport

from ..clock import FakeClock
from ..episode import Episode
from ..state import DictState
from ..stats import Estimate, clopper_pearson, pass_hat_k, wilson
from ..store import Store

__all__ = [
    "PassK",
    "fake_clock",
    "harness_episode",
    "harness_state",
    "harness_store",
    "harness_trial",
    "passk_estimate",
    "trials_needed",
]

_METHODS = {"wilson": wilson, "clopper-pearson": clopper_pearson}


@dataclass(frozen=True)
class PassK:
    """The ``passk`` marker's settings.

    Attributes:
        trials: how many times the test runs.
        k: how many trials must all pass (pass^k); 1 by default (the success rate).
        min: the lowest acceptable lower bound of pass^k's interval; 0.5 by default.
        confidence: nominal coverage of the interval.
        method: ``wilson`` or ``clopper-pearson`` (a guarantee, wider).
    """

    trials: int
    k: int = 1
    min: float = 0.5
    confidence: float = 0.95
    method: str = "wilson"

    @classmethod
    def from_marker(cls, marker: pytest.Mark) -> PassK:
        """Read and check the marker's keyword arguments.

        Raises:
            ValueError: a missing, unknown or out-of-range argument.
        """
        if marker.args:
            raise ValueError("give its settings by keyword: passk(trials=8, k=4, min=0.9)")
        known = {"trials", "k", "min", "confidence", "method"}
        unknown = sorted(set(marker.kwargs) - known)
        if unknown:
            raise ValueError(f"unknown argument {unknown[0]!r} (arguments: {sorted(known)})")
        if "trials" not in marker.kwargs:
            raise ValueError("missing 'trials': passk(trials=8, k=4, min=0.9)")
        spec = cls(**marker.kwargs)
        if not isinstance(spec.trials, int) or spec.trials < 1:
            raise ValueError(f"trials must be a whole number >= 1, got {spec.trials!r}")
        if not isinstance(spec.k, int) or not 1 <= spec.k <= spec.trials:
            raise ValueError(f"k must be a whole number in 1..trials={spec.trials}, got {spec.k!r}")
        if not isinstance(spec.min, int | float) or not 0.0 <= spec.min <= 1.0:
            raise ValueError(f"min must lie in [0, 1], got {spec.min!r}")
        if not isinstance(spec.confidence, float) or not 0.0 < spec.confidence < 1.0:
            raise ValueError(f"confidence must lie in (0, 1), got {spec.confidence!r}")
        if spec.method not in _METHODS:
            raise ValueError(f"method must be one of {sorted(_METHODS)}, got {spec.method!r}")
        return spec


def passk_estimate(
    c: int, n: int, k: int, *, confidence: float = 0.95, method: str = "wilson"
) -> Estimate:
    """pass^k of one test from ``c`` passing trials of ``n``, with an interval.

    Args:
        c: passing trials.
        n: trials.
        k: how many trials must all pass.
        confidence: nominal coverage.
        method: ``wilson`` or ``clopper-pearson``, the interval for ``p`` raised to the k-th power.

    Returns:
        An ``Estimate`` with ``method`` ``"<method>^k"``.
    """
    base = _METHODS[method](c, n, confidence)
    value = pass_hat_k(n, c, k)
    return Estimate(
        value=value,
        low=min(base.low**k, value),
        high=max(base.high**k, value),
        method=f"{method}^k",
        confidence=confidence,
        n_tasks=1,
        k=k,
        n_trials=n,
    )


def trials_needed(
    k: int, minimum: float, *, confidence: float = 0.95, method: str = "wilson"
) -> int:
    """The fewest trials that, all passing, put pass^k's lower bound at or above ``minimum``.

    Returns:
        The trial count, or 0 if no number of trials can (``minimum`` of 1).
    """
    if minimum >= 1.0:
        return 0

    def enough(n: int) -> bool:
        return passk_estimate(n, n, k, confidence=confidence, method=method).low >= minimum

    hi = max(k, 1)
    while not enough(hi):
        hi *= 2
        if hi > 1 << 40:
            return 0
    lo = max(k, hi // 2)
    while lo < hi:
        mid = (lo + hi) // 2
        if enough(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi


@dataclass
class _Outcome:
    nodeid: str
    spec: PassK
    passed: int
    trials: int
    estimate: Estimate
    ok: bool
    pattern: str

    def line(self) -> str:
        e = self.estimate
        verdict = "ok" if self.ok else "FAILED: the lower bound is under min"
        return (
            f"{self.nodeid}: {self.passed}/{self.trials} trials passed [{self.pattern}]; "
            f"pass^{self.spec.k} = {e.value:.3f}, {e.confidence:.0%} interval "
            f"[{e.low:.3f}, {e.high:.3f}] ({e.method}); min {self.spec.min}: {verdict}"
        )


_SPEC = pytest.StashKey[PassK]()
_TRIAL = pytest.StashKey[int]()
_OUTCOMES = pytest.StashKey[list[_Outcome]]()


def pytest_configure(config: pytest.Config) -> None:
    """Declare the ``passk`` marker."""
    config.addinivalue_line(
        "markers",
        "passk(trials, k=1, min=0.5, confidence=0.95, method='wilson'): run the test as "
        "`trials` repeated trials; fail when the lower bound of pass^k's interval is under "
        "`min`.",
    )
    config.stash[_OUTCOMES] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Check every ``passk`` marker before anything runs."""
    for item in items:
        marker = item.get_closest_marker("passk")
        if marker is None:
            continue
        try:
            item.stash[_SPEC] = PassK.from_marker(marker)
        except (TypeError, ValueError) as exc:
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.passk: {exc}") from None


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run an ``async def`` ``passk`` test's trial in a fresh event loop.

    Without this, pytest fails a coroutine test that no async plugin claims, and every trial
    would count as failed. A plugin that runs it (pytest-asyncio, anyio) has already replaced
    the coroutine function by the time this hook runs, and is left to it.
    """
    if _SPEC not in pyfuncitem.stash or not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    wanted = inspect.signature(pyfuncitem.obj).parameters
    args = {name: value for name, value in pyfuncitem.funcargs.items() if name in wanted}
    asyncio.run(pyfuncitem.obj(**args))
    return True


def _crash(report: TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    message = getattr(crash, "message", None)
    return str(message) if message else report.longreprtext.strip().splitlines()[-1:][0]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """Run a ``passk`` test as repeated trials and report one verdict for them."""
    spec = item.stash.get(_SPEC, None)
    if spec is None:
        return None
    ihook = item.ihook
    ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    setup: TestReport | None = None
    teardown: TestReport | None = None
    calls: list[TestReport] = []
    for i in range(spec.trials):
        item.stash[_TRIAL] = i
        reports = runtestprotocol(item, nextitem=nextitem, log=False)
        by_when = {r.when: r for r in reports}
        teardown = by_when["teardown"]
        call = by_when.get("call")
        stop = call is None or call.skipped or teardown.failed
        if stop:
            # A setup error, a skip or a teardown error ends the trials: report it as it is.
            for report in reports:
                ihook.pytest_runtest_logreport(report=report)
            ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
            return True
        setup = setup or by_when["setup"]
        assert call is not None
        calls.append(call)
    assert setup is not None and teardown is not None
    passed = sum(1 for c in calls if c.passed)
    est = passk_estimate(passed, len(calls), spec.k, confidence=spec.confidence, method=spec.method)
    ok = est.low >= spec.min
    pattern = "".join("P" if c.passed else "F" for c in calls)
    outcome = _Outcome(item.nodeid, spec, passed, len(calls), est, ok, pattern)
    item.config.stash[_OUTCOMES].append(outcome)
    failing = [(i, c) for i, c in enumerate(calls) if c.failed]
    base = failing[0][1] if failing else calls[-1]
    summary = outcome.line()
    report = TestReport(
        nodeid=base.nodeid,
        location=base.location,
        keywords=dict(base.keywords),
        outcome="passed" if ok else "failed",
        longrepr=None,
        when="call",
        sections=[*base.sections, ("passk", summary)],
        duration=sum(c.duration for c in calls),
        start=calls[0].start,
        stop=calls[-1].stop,
        user_properties=[
            *base.user_properties,
            ("passk", {"passed": passed, "trials": len(calls), **est.to_dict()}),
        ],
    )
    if not ok:
        lines = [
            f"pass^{spec.k} = {est.value:.3f}, {est.confidence:.0%} interval "
            f"[{est.low:.3f}, {est.high:.3f}] ({est.method}): the lower bound is under "
            f"min={spec.min}",
            f"{passed}/{len(calls)} trials passed: {pattern}",
        ]
        if passed == len(calls):
            need = trials_needed(spec.k, spec.min, confidence=spec.confidence, method=spec.method)
            lines.append(
                f"every trial passed, but {len(calls)} trials cannot show pass^{spec.k} >= "
                f"{spec.min}: "
                + (
                    f"that needs at least {need} trials, all passing"
                    if need
                    else "no number of trials can show min=1"
                )
            )
        for i, call in failing[:3]:
            lines.append(f"trial {i} failed: {_crash(call)}")
        if failing:
            lines.append("")
            lines.append(f"first failing trial ({failing[0][0]}):")
            lines.append(failing[0][1].longreprtext)
        report.longrepr = "\n".join(lines)
    # junitxml reads user properties from the teardown report.
    teardown.user_properties = [*teardown.user_properties, report.user_properties[-1]]
    for rep in (setup, report, teardown):
        ihook.pytest_runtest_logreport(report=rep)
    ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Print every ``passk`` test's estimate and interval."""
    outcomes = config.stash.get(_OUTCOMES, [])
    if not outcomes:
        return
    terminalreporter.write_sep("-", "pass^k")
    for outcome in outcomes:
        terminalreporter.write_line(outcome.line())


# --------------------------------------------------------------------------------------------
# Fixtures.
# --------------------------------------------------------------------------------------------


@pytest.fixture
def harness_store(tmp_path: Path) -> Iterator[Store]:
    """A fresh store (SQLite, WAL) in the test's ``tmp_path``."""
    store = Store(tmp_path / "harness" / "harness.db", create=True)
    yield store
    store.close()


@pytest.fixture
def fake_clock() -> FakeClock:
    """A clock whose sleeps take no time and are recorded in ``.sleeps``."""
    return FakeClock()


@pytest.fixture
def harness_state() -> DictState:
    """An empty ``DictState``: put the resources the test needs in it."""
    return DictState()


@pytest.fixture
def harness_episode(
    harness_state: DictState, harness_store: Store, fake_clock: FakeClock
) -> Iterator[Episode]:
    """An entered episode over ``harness_state``, recording in ``harness_store``.

    Actions called in the test run as transactions of this episode; it closes after the test.
    """
    with Episode(state=harness_state, store=harness_store, clock=fake_clock) as episode:
        yield episode


@pytest.fixture
def harness_trial(request: pytest.FixtureRequest) -> int:
    """The trial index (0-based) of a ``passk`` test; 0 for other tests."""
    return int(request.node.stash.get(_TRIAL, 0))

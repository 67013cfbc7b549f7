"""Gating CI on a report: ``--fail-under "pass^4=0.8"``.

A :class:`Bar` names a metric the report computes (``pass^K`` or ``pass@K``) and the lowest
acceptable value; :func:`judge` holds a report to its bars on the interval's lower bound (the
default: "we are 95% confident it is at least this") or on the point estimate, and
:func:`exit_status` turns the verdicts into the exit status a CI job reads.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..stats import Estimate
from .model import Report

__all__ = [
    "BASES",
    "EXIT_BELOW_BAR",
    "EXIT_INFRA",
    "Bar",
    "Basis",
    "Judgement",
    "exit_status",
    "judge",
]

Basis = Literal["lower", "point"]
BASES: tuple[Basis, ...] = ("lower", "point")

# Exit statuses: 2 is a usage or harness error (click's and ``cli._common.fail``'s), 130 an
# interrupted run.
EXIT_BELOW_BAR = 1
EXIT_INFRA = 3

_EXAMPLE = '--fail-under "pass^4=0.8"'
_METRIC = re.compile(r"pass(?P<kind>[\^@])(?P<k>\S*)")


@dataclass(frozen=True)
class Bar:
    """One ``--fail-under`` bar: a metric and the lowest value it may take.

    Attributes:
        kind: ``^`` for pass^k (every one of k trials passes), ``@`` for pass@k (at least one).
        k: trials per attempt.
        minimum: the bar, in [0, 1]; a value below it fails.
    """

    kind: Literal["^", "@"]
    k: int
    minimum: float

    @property
    def metric(self) -> str:
        """``pass^4`` or ``pass@4``."""
        return f"pass{self.kind}{self.k}"

    def __str__(self) -> str:
        return f"{self.metric}={self.minimum:g}"

    @classmethod
    def parse(cls, text: str) -> Bar:
        """Read ``METRIC=VALUE``, e.g. ``pass^4=0.8`` or ``pass@1=0.95``.

        Raises:
            ValueError: bad syntax, an unknown metric, a k under 1 or a value outside [0, 1];
                the message names the fix.
        """
        metric, eq, value = (part.strip() for part in text.partition("="))
        if not eq:
            raise ValueError(f"{text!r} is not METRIC=VALUE: write it as {_EXAMPLE}")
        match = _METRIC.fullmatch(metric)
        if match is None:
            raise ValueError(
                f"unknown metric {metric!r} in {text!r}: use pass^K (all of K trials pass) or "
                f"pass@K (at least one of K passes), e.g. {_EXAMPLE}"
            )
        k_text = match["k"]
        if not k_text.isdigit() or int(k_text) < 1:
            raise ValueError(
                f"k in {metric!r} must be a whole number >= 1, e.g. pass{match['kind']}4"
            )
        try:
            minimum = float(value)
        except ValueError:
            minimum = float("nan")
        if not 0.0 <= minimum <= 1.0:
            raise ValueError(
                f"the bar in {text!r} must be a number from 0 to 1 (0.8, not 80%), e.g. {_EXAMPLE}"
            )
        kind: Literal["^", "@"] = "^" if match["kind"] == "^" else "@"
        return cls(kind, int(k_text), minimum)

    def check_k(self, n: int) -> None:
        """Refuse a k larger than the ``n`` trials per task there are to estimate from.

        Raises:
            ValueError: ``k > n``; the message names both and the fix.
        """
        if self.k > n:
            raise ValueError(
                f"{self} needs at least {self.k} trials per task and the run has {n}: "
                f"lower k to at most {n}, or run with --trials {self.k}"
            )


@dataclass(frozen=True)
class Judgement:
    """A report held to one bar.

    Attributes:
        bar: the bar.
        estimate: the metric's estimate, with its interval.
        basis: ``lower`` (the interval's lower bound) or ``point`` (the estimate) is compared.
    """

    bar: Bar
    estimate: Estimate
    basis: Basis

    @property
    def figure(self) -> float:
        """The number compared with the bar."""
        return self.estimate.low if self.basis == "lower" else self.estimate.value

    @property
    def passed(self) -> bool:
        """Whether the figure is at or above the bar."""
        return self.figure >= self.bar.minimum

    def describe(self) -> str:
        """One line: the estimate, its interval, the figure used and the verdict."""
        e = self.estimate
        which = "lower bound" if self.basis == "lower" else "estimate"
        verdict = "ok" if self.passed else "BELOW THE BAR"
        sign = ">=" if self.passed else "<"
        return (
            f"{self.bar.metric} = {e.value:.3f}, {e.confidence:.0%} interval "
            f"[{e.low:.3f}, {e.high:.3f}]: {which} {self.figure:.3f} {sign} "
            f"{self.bar.minimum:g}: {verdict}"
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "bar": str(self.bar),
            "metric": self.bar.metric,
            "minimum": self.bar.minimum,
            "basis": self.basis,
            "figure": self.figure,
            "passed": self.passed,
            "estimate": self.estimate.to_dict(),
        }


def judge(report: Report, bars: Sequence[Bar], basis: Basis = "lower") -> list[Judgement]:
    """Hold ``report`` to every bar.

    Raises:
        ValueError: a bar's k exceeds the report's trials per task (``Bar.check_k``).
    """
    out = []
    for bar in bars:
        bar.check_k(report.n)
        e = report.pass_hat(bar.k) if bar.kind == "^" else report.pass_at(bar.k)
        out.append(Judgement(bar, e, basis))
    return out


def exit_status(report: Report, judgements: Sequence[Judgement]) -> int:
    """0, ``EXIT_BELOW_BAR`` when a metric is under its bar, or ``EXIT_INFRA`` when
    infrastructure failures dominate (more than half of the trials run), which says nothing
    about the agent whatever the bars say."""
    if report.infra_dominates:
        return EXIT_INFRA
    return EXIT_BELOW_BAR if any(not j.passed for j in judgements) else 0

"""The checks a verdict is made of."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from harness import FieldCheck, Task, canonical, digest

__all__ = [
    "CheckResult",
    "Verdict",
    "changes_digest",
    "field_checks",
    "partial_credit",
    "required_outputs",
    "state_equality",
    "verify",
]


@dataclass
class CheckResult:
    """One check: its name, whether it held, and what it compared."""

    name: str
    passed: bool
    compared: dict[str, Any] = field(default_factory=dict)


@dataclass
class Verdict:
    """A trial's verdict: pass/fail from the checks, partial credit beside it."""

    passed: bool
    partial: float | None
    checks: list[CheckResult]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "passed": self.passed,
            "partial": self.partial,
            "checks": [asdict(c) for c in self.checks],
        }


def changes_digest(changes: Mapping[str, Any]) -> str:
    """Digest of ``{resource key: final value}`` for every resource that changed."""
    return digest(dict(sorted(changes.items())))


def state_equality(actual: Mapping[str, Any], expected: Mapping[str, Any]) -> CheckResult:
    """The trial changed exactly what the reference changed, to the same values."""
    a, e = changes_digest(actual), changes_digest(expected)
    differ = sorted(
        k
        for k in set(actual) | set(expected)
        if canonical(actual.get(k)) != canonical(expected.get(k))
    )
    return CheckResult(
        "state_equality",
        a == e,
        {
            "actual_digest": a,
            "expected_digest": e,
            "differing_keys": differ[:20],
            "actual_changed": len(actual),
            "expected_changed": len(expected),
        },
    )


def _dig(value: Any, path: Sequence[str]) -> tuple[bool, Any]:
    for part in path:
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return False, None
    return True, value


def field_checks(state: Any, checks: Sequence[FieldCheck]) -> list[CheckResult]:
    """Each field check against the live state adapter."""
    out = []
    for check in checks:
        found, value = _dig(state.get(check.key), check.path)
        if check.absent:
            ok = not found or value is None
        else:
            ok = found and canonical(value) == canonical(check.equals)
        out.append(
            CheckResult(
                f"field:{check.key}/{'/'.join(check.path)}",
                ok,
                {
                    "key": check.key,
                    "path": check.path,
                    "expected": None if check.absent else check.equals,
                    "absent": check.absent,
                    "actual": value,
                },
            )
        )
    return out


def required_outputs(
    message: str, outputs: Sequence[str], *, ignore_commas: bool = False
) -> CheckResult:
    """Every required output appears in the final message (case-insensitive substring);
    ``ignore_commas`` reads the message without its commas, as tau2-bench reads it
    (``$1,628`` says ``1628``)."""
    text = message.lower().replace(",", "") if ignore_commas else message.lower()
    missing = [o for o in outputs if o.lower() not in text]
    return CheckResult(
        "required_outputs", not missing, {"required": list(outputs), "missing": missing}
    )


def partial_credit(done: Sequence[bool]) -> float | None:
    """Fraction of the reference's writes whose effect the trial made (None if it has none)."""
    return None if not done else sum(done) / len(done)


def verify(
    task: Task,
    *,
    actual: Mapping[str, Any],
    expected: Mapping[str, Any],
    message: str,
    state: Any,
    steps: Sequence[bool],
) -> Verdict:
    """The verdict on one trial: every check must hold; partial credit is reported beside it."""
    checks = [state_equality(actual, expected)]
    checks.extend(field_checks(state, task.checks))
    if task.required_outputs:
        checks.append(
            required_outputs(message, task.required_outputs, ignore_commas=task.source == "tau2")
        )
    partial = partial_credit(steps) if task.partial_credit == "steps" else None
    return Verdict(all(c.passed for c in checks), partial, checks)

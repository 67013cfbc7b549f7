"""Task-level verifiers: a trial passes only on verified external state.

Each check records what it compared, so a verdict can be audited: final-state equality with the
state the reference actions produce (by digest of the changes), field checks on resources,
required outputs in the agent's final message (case-insensitive substrings, as tau-bench does),
and explicit partial credit, reported separately from pass/fail.

:func:`verify` is the verifier a suite uses unless its ``suite.json`` names another
(``"verifier": "module:function"``, a :class:`harness.Verifier`); a suite names these as
``harness.verifiers:<name>`` (or ``verifiers:<name>``, their former top-level name). This package
uses harness's public API only, and nothing else in harness imports it.
"""

from .checks import (
    CheckResult,
    Verdict,
    changes_digest,
    field_checks,
    partial_credit,
    required_outputs,
    state_equality,
    verify,
)

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

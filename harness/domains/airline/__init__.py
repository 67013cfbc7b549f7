"""The tau2-bench airline environment on SQLite: schema and data (`db`), upstream's models
(`models`), plain tools (`tools`), the write tools as transactional actions (`actions`) and one
trial's environment (`environment`).

The data (``data/db.json``, ``data/policy.md``, ``data/tools.json``, read with
:mod:`importlib.resources`) and the behaviour of the tools follow Sierra Research's tau2-bench
(MIT licence, kept beside the data in ``data/LICENSE``). Upstream's ``db.json`` is not in its
published repository; the one shipped here was rebuilt from tau-bench's airline data (same
authors, MIT) with the three edits tau2 made to it, and reproduces upstream's reference replays.
"""

from harness.domains.airline.actions import build_actions
from harness.domains.airline.db import DATABASE
from harness.domains.airline.environment import POLICY, TOOL_DEFS, AirlineEnvironment
from harness.domains.airline.tools import (
    READ_TOOLS,
    WRITE_TOOLS,
    AirlineError,
    AirlineTools,
    upstream_error,
)
from harness.domains.records import changes, changes_fingerprint

__all__ = [
    "DATABASE",
    "POLICY",
    "READ_TOOLS",
    "TOOL_DEFS",
    "WRITE_TOOLS",
    "AirlineEnvironment",
    "AirlineError",
    "AirlineTools",
    "build_actions",
    "changes",
    "changes_fingerprint",
    "upstream_error",
]

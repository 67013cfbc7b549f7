"""The tau2-bench retail environment on SQLite: schema and data (`db`), plain tools (`tools`),
the write tools as transactional actions (`actions`) and one trial's environment (`environment`).

The data (``data/db.json``, ``data/policy.md``, read with :mod:`importlib.resources`) and the
behaviour of the tools follow Sierra Research's tau2-bench (MIT licence, kept beside the data in
``data/LICENSE``).
"""

from harness.domains.retail.actions import build_actions
from harness.domains.retail.db import (
    changes,
    changes_fingerprint,
    connect,
    export,
    fresh_copy,
    template_path,
)
from harness.domains.retail.environment import POLICY, TOOL_DEFS, RetailEnvironment
from harness.domains.retail.tools import (
    READ_TOOLS,
    WRITE_TOOLS,
    RetailError,
    RetailTools,
    upstream_error,
)

__all__ = [
    "POLICY",
    "READ_TOOLS",
    "TOOL_DEFS",
    "WRITE_TOOLS",
    "RetailEnvironment",
    "RetailError",
    "RetailTools",
    "build_actions",
    "changes",
    "changes_fingerprint",
    "connect",
    "export",
    "fresh_copy",
    "template_path",
    "upstream_error",
]

"""The tau2-bench retail environment on SQLite: schema and data (`db`), plain tools (`tools`).

The data and the behaviour of the tools follow Sierra Research's tau2-bench (MIT licence, kept
beside the data in ``tasks/retail/LICENSE``).
"""

from harness.domains.retail.db import (
    changes,
    changes_fingerprint,
    connect,
    export,
    fresh_copy,
    template_path,
)
from harness.domains.retail.tools import READ_TOOLS, WRITE_TOOLS, RetailError, RetailTools

__all__ = [
    "READ_TOOLS",
    "WRITE_TOOLS",
    "RetailError",
    "RetailTools",
    "changes",
    "changes_fingerprint",
    "connect",
    "export",
    "fresh_copy",
    "template_path",
]

"""The ``harness`` command line: a thin layer over the library, one module per command group.

- :mod:`.run`: ``run``, ``resume``, ``replay`` (trials are executed).
- :mod:`.audit`: ``audit``, ``verify``, ``escalations`` (a run's or store's record, and
  decisions on it).
- :mod:`.report`: ``report``, ``compare``, ``export`` (a run read back).
- :mod:`.keys`: ``keygen`` (a signing key pair).
- :mod:`.new_suite`: ``new-suite`` (a working skeleton suite to edit).
- :mod:`._common`: the console, errors, JSON output; environment variables are read there only.
"""

from __future__ import annotations

import click

from .._version import __version__
from .audit import audit_command, escalations_command, verify_command
from .keys import keygen_command
from .mcp import mcp_group
from .new_suite import new_suite_command
from .report import compare_command, export_command, report_command
from .run import replay_command, resume_command, run_command, work_command

__all__ = ["main"]


@click.group()
# The version from the package itself: the distribution's name (transactional-harness) is not the
# import's, and an editable install has no installed package click could map the import to.
@click.version_option(__version__, prog_name="harness")
def main() -> None:
    """A transactional agent-execution harness."""


for _command in (
    run_command,
    resume_command,
    work_command,
    replay_command,
    audit_command,
    escalations_command,
    verify_command,
    report_command,
    compare_command,
    export_command,
    keygen_command,
    new_suite_command,
    mcp_group,
):
    main.add_command(_command)

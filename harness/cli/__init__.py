"""The ``harness`` command line: a thin layer over the library, one module per command group.

- :mod:`.run`: ``run``, ``resume``, ``replay`` (trials are executed).
- :mod:`.audit`: ``audit``, ``verify``, ``escalations`` (a run's or store's record, and
  decisions on it).
- :mod:`.report`: ``report``, ``compare``, ``export`` (a run read back).
- :mod:`.keys`: ``keygen`` (a signing key pair).
- :mod:`.new_suite`: ``new-suite`` (a working skeleton suite to edit).
- :mod:`.state`: ``state uninstall`` (the change capture an adapter left in a database).
- :mod:`._common`: the console, errors, JSON output; environment variables are read there only.

Each command's module is imported when the command is named (``harness --version`` and
``harness --help`` import almost nothing), and a command that owns Ctrl-C (``run``, ``resume``,
``work``) owns it before its module loads: a Ctrl-C while the harness loads stops the run before
its first trial, never lost in the import.
"""

from __future__ import annotations

import importlib

import click

from .._interrupt import StopOnSigint
from .._version import __version__

__all__ = ["main"]

# name: (module, attribute, whether the command owns Ctrl-C)
_COMMANDS: dict[str, tuple[str, str, bool]] = {
    "run": (".run", "run_command", True),
    "resume": (".run", "resume_command", True),
    "work": (".run", "work_command", True),
    "replay": (".run", "replay_command", False),
    "audit": (".audit", "audit_command", False),
    "escalations": (".audit", "escalations_command", False),
    "verify": (".audit", "verify_command", False),
    "report": (".report", "report_command", False),
    "compare": (".report", "compare_command", False),
    "export": (".report", "export_command", False),
    "keygen": (".keys", "keygen_command", False),
    "new-suite": (".new_suite", "new_suite_command", False),
    "mcp": (".mcp", "mcp_group", False),
    "state": (".state", "state_group", False),
}


class _Commands(click.Group):
    """The commands of :data:`_COMMANDS`, each imported when it is named (click's lazy group)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*_COMMANDS, *super().list_commands(ctx)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = _COMMANDS.get(cmd_name)
        if where is None:
            return super().get_command(ctx, cmd_name)
        module, attribute, owns_ctrl_c = where
        if owns_ctrl_c and not ctx.resilient_parsing:
            stop, new = StopOnSigint.active()
            if new:
                ctx.with_resource(stop)
        command = getattr(importlib.import_module(module, __package__), attribute)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=_Commands)
# The version from the package itself: the distribution's name (transactional-harness) is not the
# import's, and an editable install has no installed package click could map the import to.
@click.version_option(__version__, prog_name="harness")
def main() -> None:
    """A transactional agent-execution harness."""

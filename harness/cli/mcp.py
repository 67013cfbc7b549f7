"""``harness mcp``: actions served as MCP tools, and a transactional proxy for an MCP server.

The MCP SDK is imported when a command runs, never when the command line starts: it is an
optional extra (``transactional-harness[mcp]``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..errors import ConfigurationError, HarnessError
from ._common import fail

__all__ = ["mcp_group"]

_TRANSPORT = click.Choice(["stdio", "http"])


def _integration(name: str) -> Any:
    try:
        if name == "proxy":
            from ..integrations import mcp_proxy

            return mcp_proxy
        from ..integrations import mcp

        return mcp
    except ImportError as exc:
        fail(
            ConfigurationError(
                f"harness mcp needs the MCP SDK ({exc}); install transactional-harness[mcp]"
            )
        )


@click.group("mcp")
def mcp_group() -> None:
    """Serve actions as MCP tools, or put transactions in front of an MCP server."""


def _serving_options(command: Any) -> Any:
    """``--transport``, ``--host``, ``--port`` and ``--episode-id``: how a server is reached,
    and the episode its first session continues."""
    for option in reversed(
        [
            click.option("--transport", type=_TRANSPORT, default="stdio", show_default=True),
            click.option("--host", default="127.0.0.1", show_default=True, help="HTTP interface."),
            click.option("--port", default=8000, show_default=True, type=int, help="HTTP port."),
            click.option(
                "--episode-id",
                default=None,
                help="The first session's episode id; an existing (escalated) episode is resumed.",
            ),
        ]
    ):
        command = option(command)
    return command


@mcp_group.command("serve")
@click.argument("target")
@click.option(
    "--state",
    default=None,
    help="module:attribute of the state adapter [default: the module's `state`, or what "
    "TARGET's function returns].",
)
@click.option(
    "--store",
    default="sqlite:///logs/harness.db",
    show_default=True,
    help="Where the episodes are recorded (a database URL).",
)
@_serving_options
@click.option("--name", default="harness", show_default=True, help="The server's name.")
def serve_command(
    target: str,
    state: str | None,
    store: str,
    transport: str,
    host: str,
    port: int,
    episode_id: str | None,
    name: str,
) -> None:
    """Serve the actions TARGET names (module:attribute) as MCP tools, one episode per session.

    TARGET is a list or dict of @hx.action functions, or a function returning one, or
    (state, actions). Over HTTP the server listens at http://HOST:PORT/mcp.
    """
    integration = _integration("serve")
    try:
        served = integration.load_served(target, state=state)
        server = integration.build_server(
            served.actions,
            state=served.state,
            store=store,
            policy=served.policy,
            name=name,
            episode_id=episode_id,
        )
    except HarnessError as exc:
        fail(exc)
    integration.run(server, transport=transport, host=host, port=port)


@mcp_group.command("proxy")
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--store",
    default=None,
    help="Where the episodes are recorded [default: the config's, else sqlite:///logs/harness.db].",
)
@_serving_options
def proxy_command(
    config: Path,
    store: str | None,
    transport: str,
    host: str,
    port: int,
    episode_id: str | None,
) -> None:
    """Serve the tools of the upstream MCP server CONFIG names, each call a transaction.

    CONFIG (TOML) names the upstream server (a command or a URL), how state is read from it,
    and per tool its writes, checks, compensation and idempotency key (see docs/mcp.md).
    """
    integration = _integration("proxy")
    try:
        cfg = integration.load_config(config)
        if store is not None:
            cfg = cfg.with_store(store)
        integration.serve_proxy(
            cfg, transport=transport, host=host, port=port, episode_id=episode_id
        )
    except HarnessError as exc:
        fail(exc)

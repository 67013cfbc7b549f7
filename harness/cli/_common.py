"""What every command shares: the console, how errors end a command, JSON output, settings.

Environment variables are read here only (:func:`openai_settings`), never in the library.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.markup import escape

from ..agents.judge import JUDGE_DEFAULT_BASE_URL
from ..errors import ConfigurationError, HarnessError
from ..runs.layout import open_run, open_store
from ..runs.resume import resume_line
from ..store import PublicKey, SigningKey, VerifyReport, Witness

__all__ = [
    "console",
    "dump",
    "fail",
    "judged",
    "openai_said",
    "openai_settings",
    "signing_key",
    "signing_key_option",
    "suite_options",
    "unverified_option",
    "verified",
    "verify_options",
    "what_is_left",
]

console = Console(soft_wrap=True, highlight=False)

OPENAI_DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"


def fail(exc: HarnessError) -> NoReturn:
    """End the command: the error on stderr, exit status 2."""
    Console(stderr=True, soft_wrap=True, highlight=False).print(
        f"[red]error:[/red] {escape(str(exc))}"
    )
    sys.exit(2)


def dump(value: Any) -> None:
    """Print ``value`` as JSON (strict: a NaN is an error, not a bare ``NaN``)."""
    click.echo(json.dumps(value, indent=2, allow_nan=False, default=str))


def suite_options(command: Any) -> Any:
    """``--suite`` and ``--trust-suite``: which suite replay, resume and export may load."""
    command = click.option(
        "--trust-suite",
        is_flag=True,
        help="Load the suite at the path the run folder records (it imports the code it names).",
    )(command)
    return click.option(
        "--suite",
        "suite",
        default=None,
        help="The run's suite (a folder, a task file or a built-in name); needed unless the "
        "run's suite is built in or --trust-suite is given.",
    )(command)


# Where --signing-key and --witness leave their values in the command's context, so that
# signing_key() finds the witness without every command taking a parameter for it.
_KEY_GIVEN = "harness.signing_key"
_WITNESS_GIVEN = "harness.witness"


def _key_and_witness(ctx: click.Context) -> None:
    """Refuse ``--witness`` without a signing key, once both options are parsed (in either
    order)."""
    if _KEY_GIVEN not in ctx.meta or _WITNESS_GIVEN not in ctx.meta:
        return
    if ctx.meta[_WITNESS_GIVEN] and not (
        ctx.meta[_KEY_GIVEN] or os.environ.get("HARNESS_SIGNING_KEY")
    ):
        raise click.UsageError(
            "--witness mirrors the signatures the signing key makes, and none is given: add "
            "--signing-key KEY (or set HARNESS_SIGNING_KEY); nothing was done"
        )


def _key_given(ctx: click.Context, _: click.Parameter, value: str | None) -> str | None:
    ctx.meta[_KEY_GIVEN] = value
    _key_and_witness(ctx)
    return value


def _witness_given(ctx: click.Context, _: click.Parameter, value: str | None) -> str | None:
    ctx.meta[_WITNESS_GIVEN] = value
    _key_and_witness(ctx)
    return value


def signing_key_option(what: str) -> Callable[[Any], Any]:
    """``--signing-key PATH``: sign ``what`` with this key (default: ``HARNESS_SIGNING_KEY``);
    and ``--witness FILE``: mirror each signature into FILE too (:func:`signing_key` attaches
    it to the key; the command takes no parameter for it)."""
    key: Callable[[Any], Any] = click.option(
        "--signing-key",
        "signing_key_file",
        default=None,
        type=click.Path(exists=True, dir_okay=False),
        callback=_key_given,
        help=f"Sign {what} with this key (harness keygen) "
        "[default: the file HARNESS_SIGNING_KEY names, if set].",
    )
    witness: Callable[[Any], Any] = click.option(
        "--witness",
        "witness_file",
        default=None,
        metavar="FILE",
        expose_value=False,
        callback=_witness_given,
        help="Also append each signature to FILE (created mode 0600, only ever appended to), "
        "kept outside the store: `harness verify TARGET --witness FILE` then finds a signed "
        "run or episode deleted, rolled back or rewritten. Needs a signing key.",
    )

    def both(command: Any) -> Any:
        return key(witness(command))

    return both


def unverified_option(command: Any) -> Any:
    """``--allow-unverified``: go on with a run whose record fails verification, marked."""
    return click.option(
        "--allow-unverified",
        is_flag=True,
        help="Go on when the run's record fails verification, marking it UNVERIFIED "
        "(without it, the command refuses).",
    )(command)


def verify_options(command: Any) -> Any:
    """``--public-key`` and ``--allow-unverified``: what a command that reads a run back
    checks first (:func:`verified`)."""
    return click.option(
        "--public-key",
        "public_key",
        default=None,
        type=click.Path(dir_okay=False, exists=True),
        help="Also check the run's signatures with this public key (harness keygen).",
    )(unverified_option(command))


def verified(
    target: Any, *, public_key: str | None = None, allow: bool = False, quiet: bool = False
) -> VerifyReport:
    """Verify ``target``'s record before reading it back (``harness verify``'s check).

    A record that fails is refused (exit 2), naming the first problem and how to see them all;
    with ``allow`` the command goes on and a red UNVERIFIED line (on stderr) says why.
    """
    try:
        key = None if public_key is None else PublicKey.load(public_key)
        with open_store(target) as opened:
            report = opened.store.verify(opened.run_id, public_key=key)
    except HarnessError as exc:
        fail(exc)
    return judged(target, report, allow=allow, quiet=quiet)


def judged(
    target: Any, report: VerifyReport, *, allow: bool = False, quiet: bool = False
) -> VerifyReport:
    """Refuse ``target`` (exit 2) when its verification ``report`` found a problem, naming
    the first and how to see them all; with ``allow``, go on, a red UNVERIFIED line (on
    stderr) saying why."""
    if report.ok:
        return report
    first = report.findings[0]
    more = len(report.findings) - 1
    said = f"{first}" + (f" (and {more} more)" if more else "")
    if not allow:
        fail(
            HarnessError(
                f"{target} fails verification: {said}. `harness verify {target}` lists every "
                "problem; nothing was read from it. Give --allow-unverified to go on anyway, "
                "marked UNVERIFIED"
            )
        )
    if not quiet:
        Console(stderr=True, soft_wrap=True, highlight=False).print(
            f"[bold red]UNVERIFIED:[/bold red] {escape(str(target))} fails verification: "
            f"{escape(said)}"
        )
    return report


def openai_settings(base_url: str | None = None, model: str | None = None) -> dict[str, Any]:
    """The ``openai`` agent's options: flags first, then ``HARNESS_OPENAI_BASE_URL``,
    ``HARNESS_OPENAI_MODEL`` and ``HARNESS_OPENAI_API_KEY``."""
    options: dict[str, Any] = {
        "base_url": base_url or os.environ.get("HARNESS_OPENAI_BASE_URL", OPENAI_DEFAULT_BASE_URL),
        "model": model or os.environ.get("HARNESS_OPENAI_MODEL", "default"),
    }
    key = os.environ.get("HARNESS_OPENAI_API_KEY")
    if key:
        options["api_key"] = key
    return options


def openai_said(base_url: str | None = None, model: str | None = None) -> str:
    """The line a run says before it starts the ``openai`` agent: the model, the server and the
    key, and where each came from, defaults said out loud (:func:`openai_settings`)."""
    env = os.environ
    server = (
        (base_url, "--base-url")
        if base_url
        else (env["HARNESS_OPENAI_BASE_URL"], "HARNESS_OPENAI_BASE_URL")
        if env.get("HARNESS_OPENAI_BASE_URL")
        else (OPENAI_DEFAULT_BASE_URL, "the default: set --base-url or HARNESS_OPENAI_BASE_URL")
    )
    named = (
        (model, "--model")
        if model
        else (env["HARNESS_OPENAI_MODEL"], "HARNESS_OPENAI_MODEL")
        if env.get("HARNESS_OPENAI_MODEL")
        else ("default", "the default: set --model or HARNESS_OPENAI_MODEL")
    )
    key = (
        "its key from HARNESS_OPENAI_API_KEY"
        if env.get("HARNESS_OPENAI_API_KEY")
        else "no key (a hosted API needs HARNESS_OPENAI_API_KEY)"
    )
    return f"openai agent: model {named[0]!r} ({named[1]}) at {server[0]} ({server[1]}), {key}"


def user_settings(
    user: str,
    *,
    model: str | None = None,
    base_url: str | None = None,
    max_steps: int | None = None,
    max_errors: int | None = None,
) -> dict[str, Any]:
    """The ``openai`` agent's options for a conversation with a user (``--user``): the user's
    name, its model and server when given (else the agent's), ``HARNESS_USER_API_KEY`` for the
    user's server, and the caps when given (else tau2's, 200 steps and 10 errors)."""
    options: dict[str, Any] = {"user": user}
    if model:
        options["user_model"] = model
    if base_url:
        options["user_base_url"] = base_url
    key = os.environ.get("HARNESS_USER_API_KEY")
    if key:
        options["user_api_key"] = key
    if max_steps is not None:
        options["max_steps"] = max_steps
    if max_errors is not None:
        options["max_errors"] = max_errors
    return options


def judge_settings(model: str | None, base_url: str | None) -> dict[str, Any] | None:
    """The judge's options (``--judge-model``, ``--judge-base-url``, else
    ``HARNESS_JUDGE_MODEL`` and ``HARNESS_JUDGE_BASE_URL``; the key from
    ``HARNESS_JUDGE_API_KEY``); None when no judge model is named.

    Raises:
        click.BadParameter: a server named without a model.
    """
    env = os.environ
    model = model or env.get("HARNESS_JUDGE_MODEL")
    base_url = base_url or env.get("HARNESS_JUDGE_BASE_URL")
    if not model:
        if base_url:
            raise click.BadParameter(
                "a judge server is named without its model: add --judge-model (or set "
                "HARNESS_JUDGE_MODEL)",
                param_hint="'--judge-model'",
            )
        return None
    options: dict[str, Any] = {"model": model, "base_url": base_url or JUDGE_DEFAULT_BASE_URL}
    if env.get("HARNESS_JUDGE_API_KEY"):
        options["api_key"] = env["HARNESS_JUDGE_API_KEY"]
    return options


def signing_key(path: str | None, *, witness: str | None = None) -> SigningKey | None:
    """The signing key: ``--signing-key PATH``, else the file ``HARNESS_SIGNING_KEY`` names;
    mirroring its signatures into ``witness``, else into the command's ``--witness`` FILE.

    Raises:
        ConfigurationError: the key does not load; a witness is given without a key, or is
            a directory or a file that cannot be appended to (before anything is signed).
    """
    if witness is None:
        ctx = click.get_current_context(silent=True)
        witness = None if ctx is None else ctx.meta.get(_WITNESS_GIVEN)
    chosen = path or os.environ.get("HARNESS_SIGNING_KEY")
    if not chosen:
        if witness:
            raise ConfigurationError(
                f"--witness {witness} mirrors the signatures the signing key makes, and none is "
                "given: add --signing-key KEY (or set HARNESS_SIGNING_KEY)"
            )
        return None
    return SigningKey.load(chosen, witness=Witness(witness) if witness else None)


def secrets() -> dict[str, Any] | None:
    """Agent options a run does not record (an API key), from the environment."""
    found = {
        option: os.environ.get(variable)
        for option, variable in (
            ("api_key", "HARNESS_OPENAI_API_KEY"),
            ("user_api_key", "HARNESS_USER_API_KEY"),
            ("judge_api_key", "HARNESS_JUDGE_API_KEY"),
        )
    }
    given = {option: key for option, key in found.items() if key}
    return given or None


def what_is_left(where: str) -> tuple[str, int]:
    """How to finish the run in ``where`` (the ``harness resume`` line with the ``--suite`` and
    ``--agent`` it needs) and how many of its escalations wait for a person."""
    try:
        with open_run(where) as run:
            ours = {e.id for e in run.store.episodes(run.run.id)}
            waiting = sum(e.episode_id in ours for e in run.store.escalation_rows("pending"))
            return resume_line(run), waiting
    except HarnessError:  # (a store refusing reads too: the plain command still holds)
        return shlex.join(["harness", "resume", where]), 0

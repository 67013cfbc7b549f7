"""The eight write tools as transactional actions, with the domain's rules as named checks.

:func:`build_actions` wraps each write method of a :class:`ConfigTools` in an
:class:`hx.Action` with its name, arguments and docstring, and gives it:

- ``writes``: the one file it changes (``services/{service}/config.json``, or ``routes.ini`` for
  ``set_canary_weight``); ``decommission_service`` declares the service's two files and their two
  places under ``archive/``.
- Preconditions named after the rules (:data:`PRECONDITIONS`), read from the live files.
- Postconditions that parse the files after the write (``ctx.after``), never the tool's return
  value: the asked change is there, and nothing else in the file moved.
- One compensation, :func:`restore_files`, that puts back ``ctx.before``: the text a file had,
  or no file where there was none.
- Idempotency keys: the arguments' hash plus the occurrence number of that identical call in the
  episode (see :class:`harness.domains.base.OccurrenceKeys`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import harness as hx
from harness.domains.base import OccurrenceKeys, delegate
from harness.domains.configs.formats import IniSections, load_ini, load_json
from harness.domains.configs.tools import (
    CRITICAL_MIN_REPLICAS,
    ENV_NAME,
    LOG_LEVELS,
    MAX_REPLICAS,
    MIN_REPLICAS,
    REGISTRY_KEY,
    REQUIRED_ENV,
    SECRET_PREFIX,
    SECRET_SUFFIXES,
    SERVICE_NAME,
    TAG_FORMAT,
    WRITE_TOOLS,
    ConfigTools,
    archive_key,
    config_key,
    remove_file,
    routes_key,
    write_text,
)

__all__ = ["POSTCONDITIONS", "PRECONDITIONS", "SCOPES", "build_actions", "restore_files"]

Record = dict[str, Any]
Check = Callable[[hx.Context], bool]
FieldPath = tuple[str, ...]
"""Keys leading to one field of a parsed file."""

# -- reading state ---------------------------------------------------------------------------


def _config(ctx: hx.Context) -> Record | None:
    """The service's configuration as it is now, or None when it has none."""
    if not SERVICE_NAME.match(ctx.args.service):
        return None
    text = ctx.state.get(config_key(ctx.args.service))
    if text is None:
        return None
    config: Record = load_json(text)
    return config


def _routes(ctx: hx.Context) -> IniSections:
    """The service's routes as they are now (empty when it has none)."""
    text = ctx.state.get(routes_key(ctx.args.service))
    return {} if text is None else load_ini(text)


def _active_services(state: Any) -> list[str]:
    """The services with a configuration file, from the adapter's folder."""
    folder = Path(state.root) / "services"
    return sorted(p.parent.name for p in folder.glob("*/config.json"))


def _is_secret(name: str) -> bool:
    return name.endswith(SECRET_SUFFIXES)


# -- preconditions: the domain's rules -------------------------------------------------------


def service_exists(ctx: hx.Context) -> bool:
    """The service is active: its name is valid and services/<name>/config.json exists."""
    return _config(ctx) is not None


def service_not_frozen(ctx: hx.Context) -> bool:
    """A frozen service (change freeze, audit, incident) cannot be changed."""
    config = _config(ctx)
    return config is not None and not config["frozen"]


def replicas_within_limits(ctx: hx.Context) -> bool:
    """Replicas stay within 1 to 50."""
    return bool(MIN_REPLICAS <= ctx.args.replicas <= MAX_REPLICAS)


def critical_keeps_two_replicas(ctx: hx.Context) -> bool:
    """A critical service keeps at least 2 replicas."""
    config = _config(ctx)
    if config is None:
        return False
    return bool(config["tier"] != "critical" or ctx.args.replicas >= CRITICAL_MIN_REPLICAS)


def tag_format_valid(ctx: hx.Context) -> bool:
    """Only release tags MAJOR.MINOR.PATCH are rolled out (no pre-releases, no 'latest')."""
    return TAG_FORMAT.match(ctx.args.tag) is not None


def tag_published(ctx: hx.Context) -> bool:
    """The tag is published for the service in registry/images.json."""
    text = ctx.state.get(REGISTRY_KEY)
    registry: Mapping[str, Sequence[str]] = {} if text is None else load_json(text)
    return ctx.args.tag in registry.get(ctx.args.service, ())


def tag_differs_from_running(ctx: hx.Context) -> bool:
    """The tag is not the one already running (a rollout to it would change nothing)."""
    config = _config(ctx)
    return config is not None and config["image"]["tag"] != ctx.args.tag


def flag_exists(ctx: hx.Context) -> bool:
    """The feature flag exists in the service's feature_flags (flags are created by code)."""
    config = _config(ctx)
    return config is not None and ctx.args.flag in config["feature_flags"]


def env_name_valid(ctx: hx.Context) -> bool:
    """The variable's name is UPPER_SNAKE_CASE."""
    return ENV_NAME.match(ctx.args.name) is not None


def secrets_are_references(ctx: hx.Context) -> bool:
    """A secret (name ending in _PASSWORD, _SECRET, _TOKEN, _KEY) is a secret:// reference."""
    return not _is_secret(ctx.args.name) or ctx.args.value.startswith(SECRET_PREFIX)


def log_level_valid(ctx: hx.Context) -> bool:
    """LOG_LEVEL is one of debug, info, warn, error."""
    return ctx.args.name != "LOG_LEVEL" or ctx.args.value in LOG_LEVELS


def env_var_exists(ctx: hx.Context) -> bool:
    """The variable is set on the service."""
    config = _config(ctx)
    return config is not None and ctx.args.name in config["env"]


def env_var_not_required(ctx: hx.Context) -> bool:
    """Every service keeps LOG_LEVEL."""
    return ctx.args.name not in REQUIRED_ENV


def setting_exists(ctx: hx.Context) -> bool:
    """The setting exists (settings are created by code, not by operators)."""
    config = _config(ctx)
    return config is not None and ctx.args.key in config["settings"]


def _same_type(old: Any, new: Any) -> bool:
    if isinstance(old, bool) or isinstance(new, bool):
        return type(old) is type(new)
    if isinstance(old, float):
        return isinstance(new, int | float)
    return type(old) is type(new)


def setting_type_matches(ctx: hx.Context) -> bool:
    """The new value has the setting's type (a whole number may replace a decimal)."""
    config = _config(ctx)
    if config is None or ctx.args.key not in config["settings"]:
        return False
    return _same_type(config["settings"][ctx.args.key], ctx.args.value)


def route_exists(ctx: hx.Context) -> bool:
    """The route is one of the service's routes."""
    return ctx.args.route in _routes(ctx)


def route_has_canary(ctx: hx.Context) -> bool:
    """The route has a canary_upstream to send traffic to."""
    return "canary_upstream" in _routes(ctx).get(ctx.args.route, {})


def percent_within_0_100(ctx: hx.Context) -> bool:
    """A canary share is 0 to 100 percent."""
    return bool(0 <= ctx.args.percent <= 100)


def service_not_critical(ctx: hx.Context) -> bool:
    """A critical service is never decommissioned by an operator agent."""
    config = _config(ctx)
    return config is not None and config["tier"] != "critical"


def no_active_dependents(ctx: hx.Context) -> bool:
    """No active service lists it in depends_on."""
    service = ctx.args.service
    for name in _active_services(ctx.state):
        text = ctx.state.get(config_key(name))
        if name != service and text is not None and service in load_json(text)["depends_on"]:
            return False
    return True


def archive_slot_free(ctx: hx.Context) -> bool:
    """Nothing is archived under archive/<service>/ yet (an archive is never overwritten)."""
    return all(ctx.state.get(kept) is None for _, kept in _service_files(ctx.args.service))


_ANY_CHANGE: Final = (service_exists, service_not_frozen)

PRECONDITIONS: Final[Mapping[str, tuple[Check, ...]]] = {
    "set_replicas": (*_ANY_CHANGE, replicas_within_limits, critical_keeps_two_replicas),
    "rollout_image": (*_ANY_CHANGE, tag_format_valid, tag_published, tag_differs_from_running),
    "set_feature_flag": (*_ANY_CHANGE, flag_exists),
    "set_env_var": (*_ANY_CHANGE, env_name_valid, secrets_are_references, log_level_valid),
    "remove_env_var": (*_ANY_CHANGE, env_var_exists, env_var_not_required),
    "set_setting": (*_ANY_CHANGE, setting_exists, setting_type_matches),
    "set_canary_weight": (*_ANY_CHANGE, route_exists, route_has_canary, percent_within_0_100),
    "decommission_service": (
        *_ANY_CHANGE,
        service_not_critical,
        no_active_dependents,
        archive_slot_free,
    ),
}
"""Each write tool's preconditions, in the order they are checked (the first false refuses)."""


# -- scopes ----------------------------------------------------------------------------------

SCOPES: Final[Mapping[str, tuple[str, ...]]] = {
    **{name: ("services/{service}/config.json",) for name in WRITE_TOOLS},
    "set_canary_weight": ("services/{service}/routes.ini",),
    "decommission_service": (
        "services/{service}/config.json",
        "services/{service}/routes.ini",
        "archive/{service}/config.json",
        "archive/{service}/routes.ini",
    ),
}
"""Each write tool's ``writes`` patterns."""


# -- postconditions: read the files back ------------------------------------------------------


def _parsed(text: str | None, key: str) -> Any:
    if text is None:
        return None
    return load_ini(text) if key.endswith(".ini") else load_json(text)


def _before_after(ctx: hx.Context, key: str) -> tuple[Any, Any]:
    """The file ``key`` parsed, before and after the write (None where absent)."""
    return _parsed(ctx.before.get(key), key), _parsed(ctx.after.get(key), key)


def _after_config(ctx: hx.Context) -> Record:
    after: Record | None = _before_after(ctx, config_key(ctx.args.service))[1]
    return {} if after is None else after


def replicas_set(ctx: hx.Context) -> bool:
    """The file says the service runs the asked number of replicas."""
    return bool(_after_config(ctx).get("replicas") == ctx.args.replicas)


def tag_running(ctx: hx.Context) -> bool:
    """The file says the service runs the asked tag."""
    return bool(_after_config(ctx).get("image", {}).get("tag") == ctx.args.tag)


def previous_tag_recorded(ctx: hx.Context) -> bool:
    """The tag that ran before is kept as previous_tag (for a rollback)."""
    before, after = _before_after(ctx, config_key(ctx.args.service))
    if before is None or after is None:
        return False
    return bool(after["image"].get("previous_tag") == before["image"]["tag"])


def flag_set(ctx: hx.Context) -> bool:
    """The flag has the asked value."""
    return _after_config(ctx).get("feature_flags", {}).get(ctx.args.flag) is ctx.args.enabled


def env_var_set(ctx: hx.Context) -> bool:
    """The variable has the asked value."""
    return bool(_after_config(ctx).get("env", {}).get(ctx.args.name) == ctx.args.value)


def env_var_removed(ctx: hx.Context) -> bool:
    """The variable is gone (and the file still has its env section)."""
    env = _after_config(ctx).get("env")
    return isinstance(env, dict) and ctx.args.name not in env


def setting_set(ctx: hx.Context) -> bool:
    """The setting has the asked value, and the type it had."""
    before, after = _before_after(ctx, config_key(ctx.args.service))
    if before is None or after is None or ctx.args.key not in after["settings"]:
        return False
    new = after["settings"][ctx.args.key]
    return bool(new == ctx.args.value) and _same_type(before["settings"][ctx.args.key], new)


def canary_percent_set(ctx: hx.Context) -> bool:
    """The route's canary_percent is the asked share."""
    after = _before_after(ctx, routes_key(ctx.args.service))[1] or {}
    return bool(after.get(ctx.args.route, {}).get("canary_percent") == str(ctx.args.percent))


_ALLOWED: Final[Mapping[str, Callable[[Any], tuple[str, list[FieldPath]]]]] = {
    "set_replicas": lambda a: (config_key(a.service), [("replicas",)]),
    "rollout_image": lambda a: (
        config_key(a.service),
        [("image", "tag"), ("image", "previous_tag")],
    ),
    "set_feature_flag": lambda a: (config_key(a.service), [("feature_flags", a.flag)]),
    "set_env_var": lambda a: (config_key(a.service), [("env", a.name)]),
    "remove_env_var": lambda a: (config_key(a.service), [("env", a.name)]),
    "set_setting": lambda a: (config_key(a.service), [("settings", a.key)]),
    "set_canary_weight": lambda a: (routes_key(a.service), [(a.route, "canary_percent")]),
}
"""The file each single-file write changes, and the only fields in it that may change."""


def _without(data: Any, paths: Iterable[FieldPath]) -> Any:
    """A copy of ``data`` with the fields at ``paths`` removed (missing ones ignored)."""
    out = copy.deepcopy(data)
    for path in paths:
        node = out
        for part in path[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return out


def nothing_else_changed(ctx: hx.Context) -> bool:
    """Apart from the fields the tool is meant to change, the file is as it was."""
    key, paths = _ALLOWED[ctx.action](ctx.args)
    before, after = _before_after(ctx, key)
    return after is not None and bool(_without(before, paths) == _without(after, paths))


_FILES: Final = ("config.json", "routes.ini")
"""A service's files, as decommissioning moves them."""


def _service_files(service: str) -> list[tuple[str, str]]:
    """(live key, archive key) of each of a service's files."""
    return [(f"services/{service}/{name}", archive_key(service, name)) for name in _FILES]


def service_files_removed(ctx: hx.Context) -> bool:
    """Neither services/<name>/config.json nor routes.ini exists any more."""
    return all(ctx.after.get(live) is None for live, _ in _service_files(ctx.args.service))


def archive_matches_before(ctx: hx.Context) -> bool:
    """archive/<name>/ holds exactly the files the service had, byte for byte."""
    return all(
        ctx.after.get(kept) == ctx.before.get(live)
        for live, kept in _service_files(ctx.args.service)
    )


POSTCONDITIONS: Final[Mapping[str, tuple[Check, ...]]] = {
    "set_replicas": (replicas_set, nothing_else_changed),
    "rollout_image": (tag_running, previous_tag_recorded, nothing_else_changed),
    "set_feature_flag": (flag_set, nothing_else_changed),
    "set_env_var": (env_var_set, nothing_else_changed),
    "remove_env_var": (env_var_removed, nothing_else_changed),
    "set_setting": (setting_set, nothing_else_changed),
    "set_canary_weight": (canary_percent_set, nothing_else_changed),
    "decommission_service": (service_files_removed, archive_matches_before),
}
"""Each write tool's postconditions, checked against the files after the write."""


# -- compensation ----------------------------------------------------------------------------


def restore_files(ctx: hx.Context) -> None:
    """Put back every file the action changed: its text before, or no file if it had none.

    A file the action changed is a key of ``ctx.after`` whose value differs from
    ``ctx.before`` (this includes a file changed outside the declared scope, which the harness
    observed). A file already back to its before value is left alone.
    """
    root = Path(ctx.state.root)
    for key, after in ctx.after.items():
        before = ctx.before.get(key)
        if after == before or ctx.state.get(key) == before:
            continue
        path = root / key
        if before is None:
            remove_file(path, root)
        else:
            write_text(path, before)


# -- idempotency -----------------------------------------------------------------------------


# Idempotency keys: OccurrenceKeys (harness.domains.base), the arguments' hash plus the
# occurrence number of that identical call. Why, for this domain:
#
# Why not the engine's default (a hash of name and arguments)? It answers a call whose key
# already committed with the recorded result, without running the tool. For "set to" tools
# that is wrong after another change in between: replicas 3, then 5, then 3 again must end on
# 3, but a deduplicated third call would leave 5. Numbering identical calls within an episode
# keeps a replayed or resumed episode deduplicating exactly the calls it already made.
# Every write here is safe to run again after an unknown outcome (it sets values; a second
# decommission is refused by its preconditions), so keying is sound.


# -- building --------------------------------------------------------------------------------


def build_actions(tools: ConfigTools) -> dict[str, hx.Action[..., Record]]:
    """Turn each write tool of ``tools`` into a transactional action.

    Args:
        tools: The plain tools; the actions call its methods (looked up at each call).

    Returns:
        ``{tool name: action}`` for the eight write tools, each with its scope, preconditions,
        postconditions, compensation and idempotency key.
    """
    occurrences = OccurrenceKeys()
    actions: dict[str, hx.Action[..., Record]] = {}
    for name in WRITE_TOOLS:
        act: hx.Action[..., Record] = hx.Action(
            delegate(tools, name), writes=list(SCOPES[name]), idempotency_key=occurrences.key
        )
        for check in PRECONDITIONS[name]:
            act.precondition(check)
        for check in POSTCONDITIONS[name]:
            act.postcondition(check)
        act.compensation(restore_files)
        actions[name] = act
    return actions

"""The configs domain (``harness.domains.configs``): a service-configuration tree on FileState."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import harness as hx
from harness.agents.base import Toolbox
from harness.domains.configs import POLICY, ConfigError, ConfigsEnvironment
from harness.domains.configs.actions import PRECONDITIONS
from harness.domains.configs.formats import load_json
from harness.domains.configs.tools import READ_TOOLS, WRITE_TOOLS, write_text
from harness.errors import SuiteError
from harness.runs.start import run_trials
from harness.suite import Environment, Task, load_suite
from harness.testing import FakeClock

REPO = Path(__file__).resolve().parents[2]
SUITE = REPO / "tasks" / "configs"
TASKS = load_suite(SUITE).tasks

Call = tuple[str, dict[str, Any]]


@pytest.fixture
def env() -> Iterator[ConfigsEnvironment]:
    """A fresh configuration tree, removed after the test."""
    environment = ConfigsEnvironment()
    yield environment
    environment.close()


def tree(root: Path) -> dict[str, bytes | None]:
    """Every folder (None) and file (its bytes) under ``root``, by relative path."""
    out: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        for name in dirnames:
            out[(rel / name).as_posix() + "/"] = None
        for name in filenames:
            out[(rel / name).as_posix()] = (Path(dirpath) / name).read_bytes()
    return out


def call(env: ConfigsEnvironment, name: str, arguments: dict[str, Any]) -> Any:
    """Call a tool as an agent would (inside an episode for writes)."""
    return env.tools[name](**arguments)


def config(env: ConfigsEnvironment, service: str) -> dict[str, Any]:
    """A service's configuration file, parsed, read past the tools."""
    data: dict[str, Any] = load_json((env.root / "services" / service / "config.json").read_text())
    return data


# -- the suite -------------------------------------------------------------------------------


def test_suite_loads_with_its_environment() -> None:
    """The suite folder loads: at least 15 tasks, on ConfigsEnvironment, completes and refusals."""
    suite = load_suite(SUITE)
    assert suite.name == "configs"
    assert suite.environment == "harness.domains.configs.environment:ConfigsEnvironment"
    assert len(suite.tasks) >= 15
    assert {t.expect for t in suite.tasks} == {"complete", "refuse"}
    assert all(t.tags for t in suite.tasks)
    assert sum(bool(t.required_outputs) for t in suite.tasks) >= 8
    with suite.new_environment() as environment:
        assert isinstance(environment, Environment)


def test_tasks_read_then_write_within_eight_steps() -> None:
    """Complete tasks start with a read, write at least once and take 2 to 8 steps; refusals
    only read."""
    for task in TASKS:
        names = [c.name for c in task.reference_actions]
        assert set(names) <= ConfigsEnvironment.TOOL_NAMES, task.id
        if task.expect == "refuse":
            assert names and set(names) <= set(READ_TOOLS), task.id
        else:
            assert 2 <= len(names) <= 8, task.id
            assert names[0] in READ_TOOLS and set(names) & set(WRITE_TOOLS), task.id


def test_every_write_tool_is_exercised_by_some_task() -> None:
    """Each of the eight write tools appears in some task's reference actions."""
    used = {c.name for t in TASKS for c in t.reference_actions}
    assert set(WRITE_TOOLS) <= used


def test_unknown_tool_in_a_task_file_is_rejected(tmp_path: Path) -> None:
    """A task naming a tool the environment does not have fails to load, naming the tool."""
    data = json.loads((SUITE / "tasks.json").read_text())
    data["tasks"][0]["reference_actions"][0]["name"] = "restart_service"
    (tmp_path / "tasks.json").write_text(json.dumps(data))
    (tmp_path / "suite.json").write_text((SUITE / "suite.json").read_text())
    with pytest.raises(SuiteError, match="restart_service"):
        load_suite(tmp_path)


def test_tool_names_match_the_tools() -> None:
    """TOOL_NAMES is exactly the tools an environment offers, and the writes are actions."""
    with ConfigsEnvironment() as environment:
        assert set(environment.tools) == ConfigsEnvironment.TOOL_NAMES
        for name in WRITE_TOOLS:
            assert isinstance(environment.tools[name], hx.Action)
        for name in READ_TOOLS:
            assert not isinstance(environment.tools[name], hx.Action)


def test_every_tool_describes_each_argument_for_a_model(
    env: ConfigsEnvironment, store_url: str
) -> None:
    """Each tool, as a model is shown it, has a description and a described property per
    argument."""
    specs = Toolbox(env.tools, hx.Episode(state=env.state, store=store_url)).specs
    assert len(specs) == len(ConfigsEnvironment.TOOL_NAMES)
    for spec in specs:
        function = spec["function"]
        assert function["description"], function["name"]
        for arg, schema in function["parameters"].get("properties", {}).items():
            assert schema.get("description"), f"{function['name']}.{arg}"


# -- replaying the reference actions ----------------------------------------------------------


def _replay(env: ConfigsEnvironment, task: Task, store_url: str) -> tuple[hx.Episode, list[Any]]:
    results = []
    with hx.Episode(state=env.state, store=store_url, task_id=task.id) as ep:
        for c in task.reference_actions:
            results.append(call(env, c.name, c.arguments))
    return ep, results


@pytest.mark.parametrize("task", TASKS, ids=[t.id for t in TASKS])
def test_reference_actions_replay(task: Task, env: ConfigsEnvironment, store_url: str) -> None:
    """Replayed on a fresh tree, a complete task's every write commits and changes the tree; a
    refusal's reads leave it exactly as it was."""
    original = tree(env.root)
    ep, _ = _replay(env, task, store_url)
    assert ep.outcome == "committed"
    writes = [c for c in task.reference_actions if c.name in WRITE_TOOLS]
    committed = [e for e in ep.committed if e.mutating and not e.compensated]
    assert [e.action for e in committed] == [c.name for c in writes]
    if task.expect == "refuse":
        assert tree(env.root) == original
    else:
        assert tree(env.root) != original
        assert ep.steps == len(writes)


@pytest.mark.parametrize("task", [t for t in TASKS if t.required_outputs], ids=lambda t: t.id)
def test_required_outputs_are_grounded(task: Task, env: ConfigsEnvironment, store_url: str) -> None:
    """What the operator must be told is in the instruction, the policy or what the reference
    actions returned (so an agent following them can know it)."""
    _, results = _replay(env, task, store_url)
    known = (task.instruction + POLICY + json.dumps(results)).lower()
    for text in task.required_outputs:
        assert text.lower() in known, text


REFUSED: dict[str, tuple[Call, str]] = {
    "auth-below-critical-minimum": (
        ("set_replicas", {"service": "auth", "replicas": 1}),
        "critical_keeps_two_replicas",
    ),
    "search-over-limit": (
        ("set_replicas", {"service": "search", "replicas": 80}),
        "replicas_within_limits",
    ),
    "rollout-recommendations-prerelease": (
        ("rollout_image", {"service": "recommendations", "tag": "1.0.0-rc.1"}),
        "tag_format_valid",
    ),
    "rollout-inventory-unpublished": (
        ("rollout_image", {"service": "inventory", "tag": "2.4.0"}),
        "tag_published",
    ),
    "payments-frozen-scale": (
        ("set_replicas", {"service": "payments", "replicas": 6}),
        "service_not_frozen",
    ),
    "billing-frozen-flag": (
        ("set_feature_flag", {"service": "billing", "flag": "invoice_pdf_v2", "enabled": True}),
        "service_not_frozen",
    ),
    "catalog-unknown-flag": (
        ("set_feature_flag", {"service": "catalog", "flag": "dark_mode", "enabled": True}),
        "flag_exists",
    ),
    "plaintext-api-key": (
        (
            "set_env_var",
            {"service": "checkout", "name": "STRIPE_API_KEY", "value": "sk_live_51Hx9q2eZvKYlo2C"},
        ),
        "secrets_are_references",
    ),
    "remove-log-level": (
        ("remove_env_var", {"service": "legacy-emailer", "name": "LOG_LEVEL"}),
        "env_var_not_required",
    ),
    "coupons-new-setting": (
        ("set_setting", {"service": "coupons", "key": "circuit_breaker_threshold", "value": 5}),
        "setting_exists",
    ),
    "decommission-coupons": (
        ("decommission_service", {"service": "coupons"}),
        "no_active_dependents",
    ),
    "scale-archived-service": (
        ("set_replicas", {"service": "legacy-reports", "replicas": 2}),
        "service_exists",
    ),
    "catalog-no-canary": (
        ("set_canary_weight", {"service": "catalog", "route": "/v1/products", "percent": 20}),
        "route_has_canary",
    ),
}
"""For each refusal task, the write it asks for and the rule that forbids it."""


def test_every_refusal_task_names_its_forbidden_write() -> None:
    """Each refusal task of the suite has its forbidden write in REFUSED (and no other)."""
    assert set(REFUSED) == {t.id for t in TASKS if t.expect == "refuse"}


@pytest.mark.parametrize("task_id", sorted(REFUSED))
def test_refusal_tasks_ask_for_what_a_rule_forbids(
    task_id: str, env: ConfigsEnvironment, store_url: str
) -> None:
    """The write a refusal task asks for is refused by the rule it is about, nothing written."""
    (name, arguments), check = REFUSED[task_id]
    original = tree(env.root)
    with hx.Episode(state=env.state, store=store_url) as ep:
        with pytest.raises(hx.PreconditionFailed) as refused:
            call(env, name, arguments)
    assert refused.value.check == check
    assert ep.steps == 0
    assert tree(env.root) == original


def test_scripted_agent_passes_every_task(tmp_path: Path) -> None:
    """Under run_trials, the scripted agent (the reference actions) passes every task."""
    result = run_trials(SUITE, agent="scripted", trials=1, logs=tmp_path)
    assert len(result.results) == len(TASKS)
    assert [r.task_id for r in result.results if not r.passed] == []


# -- preconditions ---------------------------------------------------------------------------

VALID: dict[str, dict[str, Any]] = {
    "set_replicas": {"service": "search", "replicas": 6},
    "rollout_image": {"service": "catalog", "tag": "1.13.1"},
    "set_feature_flag": {"service": "search", "flag": "spellcheck", "enabled": True},
    "set_env_var": {"service": "search", "name": "INDEX_REPLICAS", "value": "2"},
    "remove_env_var": {"service": "search", "name": "INDEX_URL"},
    "set_setting": {"service": "search", "key": "max_results", "value": 50},
    "set_canary_weight": {"service": "search", "route": "/v1/search", "percent": 50},
    "decommission_service": {"service": "search"},
}
"""A call of each write tool that every rule allows."""


def _case(tool: str, **changes: Any) -> dict[str, Any]:
    return {**VALID[tool], **changes}


REFUSALS: list[tuple[str, str, dict[str, Any]]] = [
    *[(tool, "service_exists", _case(tool, service="legacy-reports")) for tool in WRITE_TOOLS],
    *[(tool, "service_not_frozen", _case(tool, service="payments")) for tool in WRITE_TOOLS],
    ("set_replicas", "replicas_within_limits", _case("set_replicas", replicas=0)),
    (
        "set_replicas",
        "critical_keeps_two_replicas",
        _case("set_replicas", service="checkout", replicas=1),
    ),
    ("rollout_image", "tag_format_valid", _case("rollout_image", tag="latest")),
    ("rollout_image", "tag_published", _case("rollout_image", tag="1.14.0")),
    ("rollout_image", "tag_differs_from_running", _case("rollout_image", tag="1.13.0")),
    ("set_feature_flag", "flag_exists", _case("set_feature_flag", flag="typo_tolerance")),
    ("set_env_var", "env_name_valid", _case("set_env_var", name="index-replicas")),
    (
        "set_env_var",
        "secrets_are_references",
        _case("set_env_var", name="INDEX_TOKEN", value="t0k3n"),
    ),
    ("set_env_var", "log_level_valid", _case("set_env_var", name="LOG_LEVEL", value="verbose")),
    ("remove_env_var", "env_var_exists", _case("remove_env_var", name="INDEX_SHARDS")),
    ("remove_env_var", "env_var_not_required", _case("remove_env_var", name="LOG_LEVEL")),
    ("set_setting", "setting_exists", _case("set_setting", key="max_query_terms")),
    ("set_setting", "setting_type_matches", _case("set_setting", value="fifty")),
    ("set_canary_weight", "route_exists", _case("set_canary_weight", route="/v1/browse")),
    ("set_canary_weight", "route_has_canary", _case("set_canary_weight", route="/v1/suggest")),
    ("set_canary_weight", "percent_within_0_100", _case("set_canary_weight", percent=101)),
    ("decommission_service", "service_not_critical", _case("decommission_service", service="auth")),
    (
        "decommission_service",
        "no_active_dependents",
        _case("decommission_service", service="catalog"),
    ),
    ("decommission_service", "archive_slot_free", _case("decommission_service")),
]
"""For every precondition of every write tool, a call it alone refuses."""


def test_every_precondition_has_a_refusal_case() -> None:
    """REFUSALS covers each (tool, precondition) pair exactly once."""
    pairs = [(tool, check) for tool, check, _ in REFUSALS]
    expected = [(tool, c.__name__) for tool, checks in PRECONDITIONS.items() for c in checks]
    assert sorted(pairs) == sorted(expected)


@pytest.mark.parametrize(
    ("tool", "check", "arguments"), REFUSALS, ids=[f"{t}-{c}" for t, c, _ in REFUSALS]
)
def test_precondition_refuses_with_nothing_written(
    tool: str, check: str, arguments: dict[str, Any], env: ConfigsEnvironment, store_url: str
) -> None:
    """Each rule refuses its case by name before the tool runs: no file changes, no step."""
    if check == "archive_slot_free":  # a search archived earlier, and search came back
        write_text(env.root / "archive" / "search" / "config.json", "{}\n")
    original = tree(env.root)
    with hx.Episode(state=env.state, store=store_url) as ep:
        with pytest.raises(hx.PreconditionFailed) as refused:
            call(env, tool, arguments)
    assert (refused.value.action, refused.value.check) == (tool, check)
    assert tree(env.root) == original
    assert ep.steps == 0
    store = hx.Store(store_url)
    try:
        assert [t.status for t in store.transactions(ep.id)] == ["precondition"]
    finally:
        store.close()


@pytest.mark.parametrize("tool", WRITE_TOOLS)
def test_valid_calls_pass_every_rule(tool: str, env: ConfigsEnvironment, store_url: str) -> None:
    """The VALID call of each write tool (the base of every refusal case) passes every rule and
    every postcondition, and commits."""
    with hx.Episode(state=env.state, store=store_url) as ep:
        call(env, tool, VALID[tool])
    assert ep.steps == 1
    assert [e.action for e in ep.committed] == [tool]


# -- compensation and rollback ---------------------------------------------------------------


@pytest.mark.parametrize("tool", WRITE_TOOLS)
def test_compensation_restores_the_exact_files(
    tool: str, env: ConfigsEnvironment, store_url: str
) -> None:
    """Rolling back one write gives back every file byte for byte, and no folder more or less."""
    original = tree(env.root)
    with hx.Episode(state=env.state, store=store_url) as ep:
        call(env, tool, VALID[tool])
        assert tree(env.root) != original
        ep.rollback()
    assert ep.outcome == "rolled_back"
    assert tree(env.root) == original


def test_rollback_after_several_writes_restores_the_export(
    env: ConfigsEnvironment, store_url: str
) -> None:
    """An episode rolled back after writes to many files (one deleted, one created, one file
    written twice) gives back the original export and tree."""
    original_export, original_tree = env.export(), tree(env.root)
    writes: list[Call] = [
        ("set_canary_weight", {"service": "search", "route": "/v1/search", "percent": 0}),
        ("set_setting", {"service": "search", "key": "fuzzy_matching", "value": False}),
        ("set_replicas", {"service": "search", "replicas": 6}),
        ("rollout_image", {"service": "recommendations", "tag": "0.10.0"}),
        ("set_env_var", {"service": "inventory", "name": "WAREHOUSE_REGION", "value": "eu-1"}),
        ("remove_env_var", {"service": "inventory", "name": "DEBUG_SQL"}),
        ("decommission_service", {"service": "legacy-emailer"}),
        ("set_feature_flag", {"service": "auth", "flag": "passkeys", "enabled": True}),
    ]
    with hx.Episode(state=env.state, store=store_url) as ep:
        for name, arguments in writes:
            call(env, name, arguments)
        assert ep.steps == len(writes)
        assert "archive/legacy-emailer/config.json" in env.export()
        ep.rollback()
    assert ep.outcome == "rolled_back"
    assert env.export() == original_export
    assert tree(env.root) == original_tree


def test_set_to_a_value_again_after_another_change_runs_again(
    env: ConfigsEnvironment, store_url: str
) -> None:
    """Replicas 3, then 5, then 3 in one episode ends on 3: a repeated call is not answered
    from the first one's record."""
    with hx.Episode(state=env.state, store=store_url) as ep:
        for replicas in (3, 5, 3):
            call(env, "set_replicas", {"service": "search", "replicas": replicas})
    assert ep.steps == 3
    assert config(env, "search")["replicas"] == 3


def test_resumed_episode_does_not_repeat_committed_writes(
    env: ConfigsEnvironment, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replaying the same calls in a resumed episode returns the recorded results and runs no
    tool again."""
    calls: list[Call] = [
        ("set_replicas", {"service": "search", "replicas": 6}),
        ("set_replicas", {"service": "search", "replicas": 6}),
        ("rollout_image", {"service": "catalog", "tag": "1.13.1"}),
    ]
    with hx.Episode(state=env.state, store=store_url, episode_id="ops-1"):
        first = [call(env, n, a) for n, a in calls]
    ran: list[str] = []

    def counted(name: str) -> Callable[..., Any]:
        real = getattr(env.backend, name)

        def tool(*args: Any, **kwargs: Any) -> Any:
            ran.append(name)
            return real(*args, **kwargs)

        return tool

    for name in ("set_replicas", "rollout_image"):
        monkeypatch.setattr(env.backend, name, counted(name))
    with hx.Episode(state=env.state, store=store_url, episode_id="ops-1", resume=True):
        again = [call(env, n, a) for n, a in calls]
    assert again == first
    assert ran == []


# -- faults ----------------------------------------------------------------------------------


def test_write_outside_scope_is_a_scope_violation_left_for_a_person(
    env: ConfigsEnvironment, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tool that also edits another service's file is a scope failure naming that file; files
    cannot tell who wrote them (the change may be another program's), so nothing is undone and
    a person is asked, with the file in the evidence."""
    real = env.backend.set_replicas

    def also_touches_catalog(service: str, replicas: int) -> dict[str, Any]:
        result = real(service, replicas)
        other = config(env, "catalog")
        other["replicas"] = replicas
        write_text(env.root / "services" / "catalog" / "config.json", json.dumps(other))
        return result

    with hx.Episode(state=env.state, store=store_url) as ep:
        call(env, "set_feature_flag", {"service": "search", "flag": "spellcheck", "enabled": True})
        monkeypatch.setattr(env.backend, "set_replicas", also_touches_catalog)
        with pytest.raises(hx.Escalated) as raised:
            call(env, "set_replicas", {"service": "search", "replicas": 7})
    assert raised.value.failure_class == "scope"
    assert "services/catalog/config.json may be another program's" in raised.value.reason
    assert "undid nothing" in raised.value.reason
    assert ep.outcome == "escalated"
    assert config(env, "catalog")["replicas"] == 7 and config(env, "search")["replicas"] == 7
    (esc,) = hx.Store(store_url).escalations()
    assert "services/catalog/config.json" in esc.evidence["diff"]


def _claims_success(env: ConfigsEnvironment) -> Callable[..., dict[str, Any]]:
    def fake(service: str, replicas: int) -> dict[str, Any]:
        return {"service": service, "replicas": replicas, "previous": 4}

    return fake


def _writes_wrong_value(env: ConfigsEnvironment) -> Callable[..., dict[str, Any]]:
    real = env.backend.set_replicas

    def fake(service: str, replicas: int) -> dict[str, Any]:
        real(service, replicas + 1)
        return {"service": service, "replicas": replicas, "previous": 4}

    return fake


def _also_changes_owner(env: ConfigsEnvironment) -> Callable[..., dict[str, Any]]:
    real = env.backend.set_replicas

    def fake(service: str, replicas: int) -> dict[str, Any]:
        result = real(service, replicas)
        data = config(env, service)
        data["owner"] = "team-unknown"
        write_text(env.root / "services" / service / "config.json", json.dumps(data))
        return result

    return fake


@pytest.mark.parametrize(
    ("fault", "check"),
    [
        (_claims_success, "replicas_set"),
        (_writes_wrong_value, "replicas_set"),
        (_also_changes_owner, "nothing_else_changed"),
    ],
    ids=["no-write", "wrong-value", "other-field"],
)
def test_silent_fault_is_caught_by_a_postcondition(
    fault: Callable[[ConfigsEnvironment], Callable[..., dict[str, Any]]],
    check: str,
    env: ConfigsEnvironment,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tool that claims success but did not make (only) the asked change fails as ``silent``
    on the named postcondition, is retried, and leaves the file as it was."""
    original = tree(env.root)
    monkeypatch.setattr(env.backend, "set_replicas", fault(env))
    clock = FakeClock()
    with hx.Episode(state=env.state, store=store_url, clock=clock) as ep:
        with pytest.raises(hx.ActionFailed) as failed:
            call(env, "set_replicas", {"service": "search", "replicas": 7})
    assert failed.value.failure_class == "silent"
    assert check in failed.value.reason
    assert len(clock.sleeps) == hx.Retry().attempts - 1
    assert ep.steps == 0
    assert tree(env.root) == original


# -- environments ----------------------------------------------------------------------------


def test_environments_are_isolated(store_url: str) -> None:
    """Two environments have their own folders: a write in one leaves the other untouched,
    and closing one removes only its folder."""
    first, second = ConfigsEnvironment(), ConfigsEnvironment()
    try:
        assert first.root != second.root
        before = second.export()
        with hx.Episode(state=first.state, store=store_url):
            call(first, "set_replicas", {"service": "search", "replicas": 9})
        assert config(first, "search")["replicas"] == 9
        assert second.export() == before
        first.close()
        assert not first.root.exists()
        assert second.root.is_dir()
        first.close()  # closing twice is harmless
    finally:
        first.close()
        second.close()


def test_given_folder_is_kept_on_close(tmp_path: Path) -> None:
    """An environment built in a given folder fills it with the seed and leaves it on close."""
    folder = tmp_path / "tree"
    with ConfigsEnvironment(folder) as environment:
        assert environment.root == folder
    assert (folder / "services" / "search" / "config.json").is_file()


def test_export_parses_every_file(env: ConfigsEnvironment) -> None:
    """The export maps each file's relative path to its parsed content: JSON values, INI
    sections."""
    exported = env.export()
    assert sorted(exported) == sorted(env.state.to_dict())
    assert len([k for k in exported if k.endswith("/config.json")]) == 13
    assert exported["services/search/config.json"]["replicas"] == 4
    assert exported["services/search/routes.ini"]["/v1/search"]["canary_percent"] == "10"
    assert "search" in exported["registry/images.json"]
    json.dumps(exported)  # plain JSON


def test_read_tools_answer_from_the_files(env: ConfigsEnvironment) -> None:
    """The reads give the tree's content: services, one setting, routes, tags, dependents."""
    assert len(call(env, "list_services", {})) == 12
    assert call(env, "get_setting", {"service": "search", "key": "timeout_ms"})["value"] == 800
    assert "canary_upstream" in call(env, "read_routes", {"service": "search"})["/v1/search"]
    assert call(env, "read_routes", {"service": "auth"}) == {}
    assert call(env, "list_image_tags", {"service": "catalog"})["running"] == "1.13.0"
    assert call(env, "find_dependents", {"service": "catalog"})["dependents"] == [
        "checkout",
        "coupons",
        "recommendations",
        "search",
    ]


@pytest.mark.parametrize("service", ["legacy-reports", "../services/search", "Search"])
def test_reads_refuse_unknown_or_malformed_services(env: ConfigsEnvironment, service: str) -> None:
    """A read of an archived, outside-the-tree or malformed service name raises ConfigError."""
    with pytest.raises(ConfigError):
        call(env, "read_config", {"service": service})


@pytest.mark.parametrize("service", ["../archive/legacy-reports", "services/search", ""])
def test_writes_refuse_names_outside_the_tree(
    env: ConfigsEnvironment, store_url: str, service: str
) -> None:
    """A write naming a path instead of a service is refused by service_exists, nothing written."""
    original = tree(env.root)
    with hx.Episode(state=env.state, store=store_url):
        with pytest.raises(hx.PreconditionFailed, match="service_exists"):
            call(env, "set_replicas", {"service": service, "replicas": 2})
    assert tree(env.root) == original


def test_decimal_setting_accepts_a_whole_number(env: ConfigsEnvironment, store_url: str) -> None:
    """A whole number given for a decimal setting is stored as a decimal (the type is kept)."""
    with hx.Episode(state=env.state, store=store_url):
        call(env, "set_setting", {"service": "checkout", "key": "retry_budget", "value": 1})
    value = config(env, "checkout")["settings"]["retry_budget"]
    assert value == 1.0 and isinstance(value, float)


def test_write_outside_an_episode_is_refused(env: ConfigsEnvironment) -> None:
    """Calling a write tool with no episode raises NotInEpisode and writes nothing."""
    original = tree(env.root)
    with pytest.raises(hx.NotInEpisode):
        call(env, "set_replicas", {"service": "search", "replicas": 6})
    assert tree(env.root) == original

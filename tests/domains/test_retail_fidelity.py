"""What the agent sees in the retail environment is tau2-bench's, word for word.

The tool definitions, the policy and every tool message (results and errors) are compared with
the reference data in the shared folder beside the repository (``tools.json``, ``errors.json``,
``policy.md``, ``gold.json``, ``db.json``; tests that need it skip when it is absent), while the
transactions keep running underneath: a refused call is still refused before the tool runs, and
the store still records which of our checks refused it.

Upstream's code the expectations restate: sierra-research/tau2-bench at commit
a2c024725189473d2d7cea3a5cfdbcc67478e41f, ``src/tau2/environment/environment.py``
(``Environment.get_response``: ``Error: {e}`` for a failed call, ``to_json_str`` for a result:
a string as it is, a model as ``json.dumps(model.model_dump(), default=str)``),
``src/tau2/environment/tool.py`` (``Tool.openai_schema``), ``src/tau2/environment/toolkit.py``
(``use_tool``: ``Tool '<name>' not found.``) and ``src/tau2/domains/retail/data_model.py``
(field order of ``Order``, optional fields dumped as null).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import harness as hx
from harness.agents.base import Toolbox
from harness.domains.retail import POLICY, RetailEnvironment
from harness.domains.retail.actions import PRECONDITIONS
from harness.domains.retail.tools import RetailError, RetailTools, upstream_error
from harness.testing import FakeClock
from tests.domains.tau2_reference import Reference
from tests.domains.test_retail_actions import Shop, _cases, _put, _rows

RETAIL = Reference("retail")
REFERENCE = RETAIL.folder
needs_reference = RETAIL.needed
_reference, _params = RETAIL.load, RETAIL.params


@pytest.fixture
def env() -> Iterator[RetailEnvironment]:
    environment = RetailEnvironment()
    yield environment
    environment.close()


@pytest.fixture(scope="module")
def cases() -> dict[Any, Any]:
    """One refused call per (write tool, precondition), found in a fresh database."""
    with RetailEnvironment() as environment:
        return _cases(Shop(environment.export()))


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/h.db"


def _episode(env: RetailEnvironment, store_url: str, **kw: Any) -> hx.Episode:
    return hx.Episode(state=env.state, store=store_url, clock=FakeClock(), **kw)


# -- tool definitions and policy -------------------------------------------------------------------


@needs_reference
def test_tool_definitions_are_tau2s_whole_function_objects() -> None:
    """``RetailEnvironment.tool_defs()`` equals ``tools.json``: every key of every function
    object (names, descriptions, parameter schemas with pydantic's ``title`` keys), in tau2's
    order; and it is a copy, so a caller's edits do not leak."""
    defs = RetailEnvironment.tool_defs()
    assert defs == _reference("tools.json")
    assert [d["function"]["name"] for d in defs] == [
        d["function"]["name"] for d in _reference("tools.json")
    ]
    for spec in defs:  # upstream's key order (Tool.openai_schema, pydantic's JSON schema)
        assert list(spec) == ["type", "function"]
        assert list(spec["function"]) == ["name", "description", "parameters"]
        parameters = spec["function"]["parameters"]
        keys = ["properties", "required", "title", "type"]
        assert list(parameters) == [k for k in keys if k != "required" or parameters["properties"]]
    defs[0]["function"]["name"] = "changed"
    assert RetailEnvironment.tool_defs() == _reference("tools.json")


@needs_reference
def test_the_toolbox_hands_the_agent_tau2s_tools(env: RetailEnvironment, store_url: str) -> None:
    """What an agent reads from ``toolbox.specs`` is ``tools.json`` exactly, in its order."""
    with _episode(env, store_url) as ep:
        toolbox = Toolbox(env.tools, ep, env)
        assert toolbox.specs == _reference("tools.json")
    assert list(env.tools) == [d["function"]["name"] for d in _reference("tools.json")]


def test_tool_definitions_fit_the_tools_that_run(env: RetailEnvironment) -> None:
    """Each definition names exactly the arguments of the tool we run (required = without a
    default), and for the write tools the types our validation accepts are the ones the
    definition declares: what the model is told and what the harness checks agree."""
    for spec in RetailEnvironment.tool_defs():
        function = spec["function"]
        name, parameters = function["name"], function["parameters"]
        signature = inspect.signature(getattr(RetailTools, name))
        params = [p for p in signature.parameters.values() if p.name != "self"]
        assert list(parameters["properties"]) == [p.name for p in params], name
        assert parameters.get("required", []) == [p.name for p in params if p.default is p.empty], (
            name
        )
        tool = env.tools[name]
        if isinstance(tool, hx.Action):
            ours = tool.schema["properties"]
            for arg, declared in parameters["properties"].items():
                assert {
                    k: v for k, v in ours[arg].items() if k not in ("title", "description")
                } == {k: v for k, v in declared.items() if k not in ("title", "description")}, (
                    name,
                    arg,
                )


@needs_reference
def test_the_policy_is_tau2s_word_for_word(env: RetailEnvironment) -> None:
    """The policy the agent is given (``environment.policy``) is tau2's ``policy.md``."""
    expected = (REFERENCE / "policy.md").read_text(encoding="utf-8")
    assert env.policy == RetailEnvironment.policy == POLICY == expected


# -- failing calls ---------------------------------------------------------------------------------


@needs_reference
@pytest.mark.parametrize("case", _params("errors.json", "{i}-{tool}-{case}"))
def test_a_failing_call_reads_as_tau2s_tool_message(
    case: dict[str, Any], env: RetailEnvironment, store_url: str
) -> None:
    """Each of the 25 failing calls of ``errors.json``, made through the toolbox in an episode on a
    fresh database, gives the model exactly tau2's tool message (``content``), changes nothing,
    and a refused write keeps our own reason (the check that refused it, its docstring) in the
    result's ``error`` and in the store."""
    name, arguments = case["tool"], case["arguments"]
    before = _rows(env)
    with _episode(env, store_url) as ep:
        toolbox = Toolbox(env.tools, ep, env)
        result = toolbox.call(name, json.loads(json.dumps(arguments)))
    assert result.ok is False
    assert result.as_text() == case["content"]
    assert _rows(env) == before
    txns = hx.Store(store_url).transactions(ep.id)
    if name in env.actions:
        assert [t.status for t in txns] == ["precondition"]
        check = txns[0].reason.split(": ", 1)[0]
        assert check in {c.__name__ for c in PRECONDITIONS[name]}
        doc = inspect.getdoc(next(c for c in PRECONDITIONS[name] if c.__name__ == check))
        assert txns[0].reason == f"{check}: {doc.splitlines()[0]}"  # type: ignore[union-attr]
        assert result.kind == "precondition" and check in (result.error or "")
        assert result.error != case["content"]
    else:
        assert txns == []
    assert ep.outcome == "committed"


_ALL_CHECKS = [(tool, check.__name__) for tool, checks in PRECONDITIONS.items() for check in checks]


@pytest.mark.parametrize(("tool", "check"), _ALL_CHECKS, ids=[f"{t}-{c}" for t, c in _ALL_CHECKS])
def test_every_precondition_refusal_reads_as_the_tool_would_fail(
    tool: str, check: str, env: RetailEnvironment, store_url: str, cases: dict[Any, Any]
) -> None:
    """For every precondition of every write tool, a call it refuses reads to the model exactly as
    the plain tool's own error on the same database (``Error: <message>``), while the store
    records that precondition as the reason and nothing is written."""
    name, arguments, patches = cases[(tool, check)]
    for key, change in patches:
        _put(env, key, change)
    before = _rows(env)
    with _episode(env, store_url) as ep:
        result = Toolbox(env.tools, ep, env).call(name, arguments)
    assert _rows(env) == before
    with pytest.raises(RetailError) as upstream:
        getattr(env.backend, name)(**arguments)
    assert _rows(env) == before
    assert result.as_text() == f"Error: {upstream.value}"
    (txn,) = hx.Store(store_url).transactions(ep.id)
    assert (txn.status, txn.reason.split(": ", 1)[0]) == ("precondition", check)


@needs_reference
def test_other_failures_read_as_tau2s_environment_words(
    env: RetailEnvironment, store_url: str
) -> None:
    """An unknown tool and arguments that do not fit the signature read as tau2's environment
    says them (its ``use_tool`` and Python's own ``TypeError``), for reads and writes alike."""
    with _episode(env, store_url) as ep:
        toolbox = Toolbox(env.tools, ep, env)
        unknown = toolbox.call("refund_everything", {"order_id": "#W0000000"})
        write = toolbox.call("cancel_pending_order", {"order_id": "#W0000000"})
        extra = toolbox.call("modify_user_address", {"user_id": "x", "colour": "red"})
        read = toolbox.call("get_order_details", {})
    assert unknown.as_text() == "Error: Tool 'refund_everything' not found."
    assert unknown.kind == "unknown_tool" and "tools:" in (unknown.error or "")
    assert write.as_text() == (
        "Error: RetailTools.cancel_pending_order() missing 1 required positional argument: 'reason'"
    )
    assert write.kind == "invalid"
    assert extra.as_text() == (
        "Error: RetailTools.modify_user_address() got an unexpected keyword argument 'colour'"
    )
    assert read.as_text() == (
        "Error: RetailTools.get_order_details() missing 1 required positional argument: 'order_id'"
    )


# -- results ---------------------------------------------------------------------------------------

_OPTIONAL_ORDER_FIELDS = (
    "cancel_reason",
    "exchange_items",
    "exchange_new_items",
    "exchange_payment_method_id",
    "exchange_price_difference",
    "return_items",
    "return_payment_method_id",
)
"""``Order``'s optional fields, in its field order (tau2's ``data_model.py``): dumped as null."""


@needs_reference
def test_read_results_read_as_tau2s_model_dump(env: RetailEnvironment, store_url: str) -> None:
    """A read's tool message is ``json.dumps(model_dump(), default=str)`` of tau2's record (built
    here from ``db.json``: an order with its optional fields as null), a string result as it
    is."""
    data = _reference("db.json")
    order = next(o for o in data["orders"].values() if o["status"] == "delivered")
    user = data["users"][order["user_id"]]
    product = data["products"][order["items"][0]["product_id"]]
    item = product["variants"][order["items"][0]["item_id"]]
    with _episode(env, store_url) as ep:
        toolbox = Toolbox(env.tools, ep, env)
        texts = {
            "order": toolbox.call("get_order_details", {"order_id": order["order_id"]}),
            "user": toolbox.call("get_user_details", {"user_id": user["user_id"]}),
            "product": toolbox.call("get_product_details", {"product_id": product["product_id"]}),
            "item": toolbox.call("get_item_details", {"item_id": item["item_id"]}),
            "email": toolbox.call("find_user_id_by_email", {"email": user["email"]}),
            "sum": toolbox.call("calculate", {"expression": "(1 + 2) / 3"}),
        }
    dumped_order = {**order, **{k: order.get(k) for k in _OPTIONAL_ORDER_FIELDS}}
    assert texts["order"].as_text() == json.dumps(dumped_order, default=str)
    assert texts["user"].as_text() == json.dumps(user, default=str)
    assert texts["product"].as_text() == json.dumps(product, default=str)
    assert texts["item"].as_text() == json.dumps(item, default=str)
    assert texts["email"].as_text() == user["user_id"]
    assert texts["sum"].as_text() == "1.0"
    assert texts["order"].content["order_id"] == order["order_id"]  # the record stays a record


def _gold_tasks() -> list[Any]:
    return _params("gold.json", "task-{task_id}")


@needs_reference
@pytest.mark.parametrize("task", _gold_tasks())
def test_reference_actions_read_as_tau2_through_the_toolbox(
    task: dict[str, Any], env: RetailEnvironment, store_url: str
) -> None:
    """Replaying a task's reference actions through the toolbox, every write's tool message is
    tau2's result as tau2 serialises it (``gold.json``), every failure is ``Error: <tau2's
    message>``, and every write still commits (or is refused) as a transaction."""
    with _episode(env, store_url) as ep:
        toolbox = Toolbox(env.tools, ep, env)
        for index, action in enumerate(task["actions"]):
            result = toolbox.call(action["name"], json.loads(json.dumps(action["arguments"])))
            where = f"action {index} ({action['name']})"
            assert result.ok is action["ok"], where
            if not action["ok"]:
                assert result.as_text() == f"Error: {action['error'].split(': ', 1)[1]}", where
            elif "result" in action:
                value = action["result"]  # to_json_str: a string as it is, else json.dumps
                expected = value if isinstance(value, str) else json.dumps(value, default=str)
                assert result.as_text() == expected, where
    writes = [a for a in task["actions"] if a["name"] in env.actions]
    statuses = [t.status for t in hx.Store(store_url).transactions(ep.id)]
    assert statuses == ["committed" if a["ok"] else "precondition" for a in writes]


# -- resume and replay -----------------------------------------------------------------------------


def test_a_resumed_episode_shows_the_model_the_words_it_first_showed(
    env: RetailEnvironment, store_url: str
) -> None:
    """A refusal's words depend on the database when it was refused; the episode remembers them,
    so resuming after the order was cancelled shows the model the first words again (not
    ``Non-pending order cannot be modified``), while a new call is judged on the state now."""
    order = next(
        o
        for o in env.export()["orders"].values()
        if o["status"] == "pending" and len(o["payment_history"]) == 1
    )
    modify = {
        "order_id": order["order_id"],
        "item_ids": ["0000000000"],
        "new_item_ids": [order["items"][0]["item_id"]],
        "payment_method_id": order["payment_history"][0]["payment_method_id"],
    }
    cancel = {"order_id": order["order_id"], "reason": "no longer needed"}
    with _episode(env, store_url, episode_id="e1") as ep:
        toolbox = Toolbox(env.tools, ep, env)
        first = [toolbox.call("modify_pending_order_items", modify).as_text()]
        first.append(toolbox.call("cancel_pending_order", cancel).as_text())
    assert first[0] == "Error: 0000000000 not found"
    assert json.loads(first[1])["status"] == "cancelled"
    with _episode(env, store_url, episode_id="e1", resume=True) as again:
        toolbox = Toolbox(env.tools, again, env)
        resumed = [toolbox.call("modify_pending_order_items", modify).as_text()]
        resumed.append(toolbox.call("cancel_pending_order", cancel).as_text())
        now = toolbox.call("modify_pending_order_items", modify).as_text()
    assert resumed == first
    assert now == "Error: Non-pending order cannot be modified"
    statuses = [t.status for t in hx.Store(store_url).transactions("e1")]
    assert statuses == ["precondition", "committed", "precondition"]  # nothing done twice
    assert env.state.get(f"orders/{order['order_id']}")["status"] == "cancelled"


# -- the mechanism, for other environments ---------------------------------------------------------


def test_an_environment_without_hooks_keeps_the_harness_wording(store_url: str) -> None:
    """Without ``tool_defs``/``tool_message`` the toolbox renders specs and refusals as before:
    the harness's own reason is what the model reads, and no step is added to the record."""
    shop = hx.DictState({"orders/1": {"status": "delivered"}})

    @hx.action(writes=["orders/{order_id}"])
    def cancel(order_id: str) -> str:
        """Cancel an order.

        Args:
            order_id: The order.
        """
        shop.set(f"orders/{order_id}", {"status": "cancelled"})
        return "cancelled"

    @cancel.precondition
    def is_pending(ctx: hx.Context) -> bool:
        """The order is pending."""
        return bool(ctx.state.get(f"orders/{ctx.args.order_id}")["status"] == "pending")

    with hx.Episode(state=shop, store=store_url, clock=FakeClock()) as ep:
        toolbox = Toolbox({"cancel": cancel}, ep, object())
        result = toolbox.call("cancel", {"order_id": "1"})
        assert toolbox.specs == [cancel.openai_tool]
    assert result.text is None
    assert result.as_text() == f"Error: {result.error}"
    assert "is_pending" in result.as_text()
    assert [r.kind for r in hx.Store(store_url).log(ep.id) if r.kind == "remembered"] == []


def test_upstream_error_is_a_dry_run(env: RetailEnvironment) -> None:
    """``upstream_error`` runs a tool's validations without writing: None for a call the tool
    accepts (the database unchanged), the tool's message for one it refuses."""
    order = next(o for o in env.export()["orders"].values() if o["status"] == "pending")
    before = _rows(env)
    args = {"order_id": order["order_id"], "reason": "ordered by mistake"}
    assert upstream_error(env.backend, "cancel_pending_order", args) is None
    assert upstream_error(env.backend, "cancel_pending_order", {**args, "reason": "x"}) == (
        "Invalid reason"
    )
    assert _rows(env) == before
    assert env.backend.cancel_pending_order(**args)["status"] == "cancelled"


def test_a_hook_that_returns_no_text_is_a_configuration_error(store_url: str) -> None:
    """An environment whose ``tool_message`` returns something other than text or None is told
    what to return, instead of the model being shown it."""

    class Wrong:
        def tool_message(self, name: str, arguments: Any, result: Any, error: Any) -> Any:
            return {"text": "no"}

    with hx.Episode(state=hx.DictState({}), store=store_url, clock=FakeClock()) as ep:
        toolbox = Toolbox({"echo": lambda text: text}, ep, Wrong())
        with pytest.raises(hx.ConfigurationError, match="tool_message returned dict"):
            toolbox.call("echo", {"text": "hi"})

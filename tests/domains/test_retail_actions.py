"""The retail write tools as transactions (``harness.domains.retail.actions`` and ``environment``).

The reference: ``gold.json`` (what tau2's own tools did replaying each task's reference actions),
in the shared folder beside the repository; tests that need it skip when it is absent.
"""

from __future__ import annotations

import inspect
import json
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import harness as hx
from harness.domains.retail import RetailEnvironment, db
from harness.domains.retail.actions import PRECONDITIONS, restore_before
from harness.domains.retail.tools import READ_TOOLS, WRITE_TOOLS, RetailError, RetailTools
from harness.testing import FakeClock, Flaky
from tests.domains.tau2_reference import Fresh, Rows, replay, replay_as_gold, stored_rows

REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "data" / "tau2-retail"
GOLD_JSON = REFERENCE / "gold.json"
NO_GOLD = f"reference data absent: {GOLD_JSON} (the shared folder beside the repository)"

Export = dict[str, dict[str, dict[str, Any]]]
FAILED = (hx.PreconditionFailed, hx.ActionFailed, RetailError)
"""What counts as ``ok=false``: a refusal, a failed action, a tool's own refusal."""


# -- fixtures and helpers ----------------------------------------------------------------------


def _rows(env: RetailEnvironment) -> Rows:
    """Every row as stored (JSON columns as text), by table and key, in rowid order."""
    return stored_rows(env, db.DATABASE)


@pytest.fixture(scope="module")
def fresh() -> Fresh:
    """The export and rows of a fresh environment."""
    return Fresh(RetailEnvironment)


@pytest.fixture(scope="module")
def pristine(fresh: Fresh) -> Export:
    """The export of a fresh environment."""
    return fresh.export


@pytest.fixture
def env(tmp_path: Path) -> Iterator[RetailEnvironment]:
    """A fresh retail environment in the test's folder."""
    with RetailEnvironment(tmp_path / "env") as environment:
        yield environment


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """A fresh store URL."""
    return f"sqlite:///{tmp_path / 'logs' / 'harness.db'}"


def _episode(env: RetailEnvironment, store: str | hx.Store, **kw: Any) -> hx.Episode:
    return hx.Episode(state=env.state, store=store, clock=kw.pop("clock", FakeClock()), **kw)


def _changes(before: Export, after: Export) -> dict[str, Any]:
    """``db.changes`` of two exports, computed on the records that differ at all (same result:
    records equal as stored are equal without their null keys; much faster on 1,550 records)."""
    sub_before: Export = {}
    sub_after: Export = {}
    for table in after:
        old, new = before.get(table, {}), after[table]
        keys = [k for k in new if old.get(k) != new[k]] + [k for k in old if k not in new]
        sub_before[table] = {k: old[k] for k in keys if k in old}
        sub_after[table] = {k: new[k] for k in keys if k in new}
    return db.changes(sub_before, sub_after)


def _fingerprint(before: Export, after: Export) -> str:
    return db.changes_fingerprint(_changes(before, after))


def _gold() -> list[Any]:
    if not GOLD_JSON.exists():
        return [pytest.param(None, marks=pytest.mark.skip(reason=NO_GOLD))]
    tasks = json.loads(GOLD_JSON.read_text(encoding="utf-8"))
    return [pytest.param(task, id=f"task-{task['task_id']}") for task in tasks]


def _replay(env: RetailEnvironment, task: dict[str, Any]) -> tuple[list[bool], list[Any]]:
    """Call each reference action through ``env.tools``; failures are ok=false, then go on."""
    return replay(env, task, FAILED)


def _inject_transient_faults(env: RetailEnvironment, *, after: bool) -> list[str]:
    """Make the first attempt of every write call raise ``TransientError``: before the tool runs
    or, with ``after``, once it has run (a lost acknowledgement). Returns the log of real runs.

    ``Flaky`` counts calls per wrapped function, so it cannot say "the first attempt of each
    call" across many calls; the attempt number of the running transaction can.
    """
    ran: list[str] = []
    for name in WRITE_TOOLS:
        real = getattr(env.backend, name)

        def faulty(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            ctx = hx.current_context()
            first = ctx is not None and ctx.attempt == 1
            if first and not after:
                raise hx.TransientError(f"injected: {_name} unreachable")
            result = _real(*args, **kwargs)
            ran.append(_name)
            if first:
                raise hx.TransientError(f"injected: {_name} acknowledgement lost")
            return result

        setattr(env.backend, name, faulty)
    return ran


def _spy(env: RetailEnvironment, name: str) -> list[str]:
    """Count the runs of the plain tool ``name`` from now on (the log of its runs)."""
    runs: list[str] = []
    real = getattr(env.backend, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        runs.append(name)
        return real(*args, **kwargs)

    setattr(env.backend, name, spy)
    return runs


def _put(env: RetailEnvironment, key: str, change: Callable[[dict[str, Any]], None]) -> None:
    """Change one row directly (test setup, outside any episode)."""
    table, _, pk = key.partition("/")
    row = env.state.get(key)
    assert row is not None, key
    change(row)
    names = db.column_names(table)
    pk_col = db.PRIMARY_KEYS[table]
    values = dict(zip(names, db.encode(table, row), strict=True))
    assignments = ", ".join(f"{n} = ?" for n in names if n != pk_col)
    env.state.connection.execute(
        f"UPDATE {table} SET {assignments} WHERE {pk_col} = ?",
        (*(values[n] for n in names if n != pk_col), pk),
    )


# -- fidelity through the harness --------------------------------------------------------------


@pytest.mark.parametrize("task", _gold())
def test_replay_through_harness_matches_upstream(
    task: dict[str, Any], fresh: Fresh, shared_store: hx.Store
) -> None:
    """Replaying a task's reference actions as transactions fails, returns and changes exactly
    what tau2's own tools did."""
    with RetailEnvironment() as env:
        replay_as_gold(env, task, shared_store, FAILED)
        after = env.export()
        assert (
            db.changes_fingerprint(db.changes(fresh.export, after)) == (task["changes_fingerprint"])
        )
        assert fresh.changes(env) == _changes(fresh.export, after)


@pytest.mark.parametrize("after", [False, True], ids=["before-run", "lost-ack"])
@pytest.mark.parametrize("task", _gold())
def test_replay_with_transient_faults_matches_upstream(
    task: dict[str, Any], after: bool, fresh: Fresh, shared_store: hx.Store
) -> None:
    """With the first attempt of every write failing transiently, before the tool runs or after
    (effect applied, acknowledgement lost), the harness retries or recovers and ends with exactly
    upstream's failures and changes, each write applied once."""
    expected_oks = [a["ok"] for a in task["actions"]]
    applied = [a["name"] for a in task["actions"] if a["ok"] and a["name"] in WRITE_TOOLS]
    with RetailEnvironment() as env:
        ran = _inject_transient_faults(env, after=after)
        clock = FakeClock()
        with _episode(env, shared_store, clock=clock) as ep:
            oks, _ = _replay(env, task)
        assert oks == expected_oks
        assert db.changes_fingerprint(fresh.changes(env)) == task["changes_fingerprint"]
    records = shared_store.transactions(ep.id)
    writes = [t for t in records if t.mutating and t.status in ("committed", "recovered")]
    assert [t.action for t in writes] == applied
    if not after:
        assert ran == applied  # the first attempt never reached the tool
        assert all(t.status == "committed" and t.attempts == 2 for t in writes)
        assert len(clock.sleeps) == len(applied)
        return
    # A lost acknowledgement is recovered from the observed state, without running the tool
    # again, unless the write changed nothing (the values were already there): then nothing
    # is observed, the harness retries, and the second run rewrites the same values.
    expected_runs: list[str] = []
    for t in writes:
        if t.status == "recovered":
            assert t.attempts == 1
            expected_runs.append(t.action)
        else:
            assert (t.attempts, (t.diff or {})) == (2, {})
            expected_runs += [t.action, t.action]
    assert ran == expected_runs


# -- the environment ---------------------------------------------------------------------------


def test_tools_are_actions_for_writes_and_plain_methods_for_reads(
    env: RetailEnvironment,
) -> None:
    """Write tools are actions with upstream's name, signature and docstring; the other nine are
    the plain methods."""
    assert set(env.tools) == set(WRITE_TOOLS) | set(READ_TOOLS)
    assert set(env.actions) == set(WRITE_TOOLS)
    for name in WRITE_TOOLS:
        act = env.tools[name]
        method = getattr(env.backend, name)
        assert isinstance(act, hx.Action)
        assert act is env.actions[name]
        assert act.name == getattr(act, "__name__", None) == name
        assert act.__doc__ == method.__doc__
        assert inspect.signature(act) == inspect.signature(method)
        assert list(act.schema["properties"]) == list(inspect.signature(method).parameters)
        assert act.openai_tool["function"]["name"] == name
        assert act.compensable and act.safe_to_repeat and act.mutating
    for name in READ_TOOLS:
        assert env.tools[name] == getattr(env.backend, name)


def test_environment_shares_one_connection_and_cleans_up(tmp_path: Path) -> None:
    """The tools write through the adapter's connection; a throwaway environment lives in
    memory (nothing written to disk, nothing left behind), and closing twice is harmless."""
    tempfile.tempdir = str(tmp_path)  # where a file copy would go
    try:
        env = RetailEnvironment()
        assert env.backend.conn is env.state.connection
        assert isinstance(env.state, hx.SQLState)
        assert env.path is None and env.state.path == ":memory:"
        assert "memory" in repr(env)
        assert not [p for p in tmp_path.rglob("*") if "harness-templates" not in str(p)]
        env.close()
        env.close()
    finally:
        tempfile.tempdir = None
    with pytest.raises(sqlite3.ProgrammingError):
        env.state.connection.execute("SELECT 1")


def test_given_folder_is_kept(tmp_path: Path, pristine: Export) -> None:
    """An environment in a given folder starts from a fresh copy and leaves the file there."""
    with RetailEnvironment(tmp_path / "mine") as env:
        assert env.export() == pristine
        assert env.state.connection.execute("PRAGMA synchronous").fetchone()[0] == 1
        path = env.path
    assert path.exists() and path.parent == tmp_path / "mine"


def test_calling_an_action_outside_an_episode_is_refused(env: RetailEnvironment) -> None:
    """A write action called with no episode raises NotInEpisode and changes nothing."""
    before = _rows(env)
    user_id = next(iter(before["users"]))
    with pytest.raises(hx.NotInEpisode):
        env.tools["modify_user_address"](user_id, "1 Elm St", "", "Oslo", "NA", "NO", "0150")
    assert _rows(env) == before


# -- preconditions ------------------------------------------------------------------------------


class Shop:
    """Finds orders, items and methods in the pristine data for the tests below."""

    def __init__(self, data: Export) -> None:
        self.data = data

    def methods(self, order: dict[str, Any]) -> dict[str, Any]:
        methods: dict[str, Any] = self.data["users"][order["user_id"]]["payment_methods"]
        return methods

    def variants(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            v
            for v in self.data["products"][item["product_id"]]["variants"].values()
            if v["item_id"] != item["item_id"]
        ]

    def alternative(
        self, item: dict[str, Any], *, available: bool = True, pricier: bool = False
    ) -> str | None:
        for v in self.variants(item):
            if v["available"] == available and (not pricier or v["price"] > item["price"]):
                return str(v["item_id"])
        return None

    def order(
        self, status: str, test: Callable[[dict[str, Any]], bool] = lambda o: True
    ) -> dict[str, Any]:
        return next(o for o in self.data["orders"].values() if o["status"] == status and test(o))

    def gift_card(self, order: dict[str, Any]) -> str | None:
        return next((k for k, m in self.methods(order).items() if m["source"] == "gift_card"), None)

    def other_product_item(self, item: dict[str, Any]) -> str:
        product = next(
            p for p in self.data["products"].values() if p["product_id"] != item["product_id"]
        )
        return str(next(iter(product["variants"])))


Case = tuple[str, dict[str, Any], list[tuple[str, Callable[[dict[str, Any]], None]]]]


def _cases(shop: Shop) -> dict[tuple[str, str], Case]:
    """``(tool, check) -> (tool, arguments, setup patches)``: one refused call per precondition."""
    none = "#W0000000"
    pending = shop.order("pending", lambda o: shop.alternative(o["items"][0]) is not None)
    delivered = shop.order("delivered", lambda o: shop.alternative(o["items"][0]) is not None)
    p_item, d_item = pending["items"][0], delivered["items"][0]
    p_new, d_new = shop.alternative(p_item), shop.alternative(d_item)
    p_pay = pending["payment_history"][0]["payment_method_id"]
    d_pay = delivered["payment_history"][0]["payment_method_id"]
    d_unavailable = shop.order(
        "delivered", lambda o: shop.alternative(o["items"][0], available=False) is not None
    )
    p_unavailable = shop.order(
        "pending", lambda o: shop.alternative(o["items"][0], available=False) is not None
    )

    def pricier_with_gift_card(status: str) -> dict[str, Any]:
        return shop.order(
            status,
            lambda o: (
                shop.gift_card(o) is not None
                and shop.alternative(o["items"][0], pricier=True) is not None
            ),
        )

    d_gc, p_gc = pricier_with_gift_card("delivered"), pricier_with_gift_card("pending")

    def gift_cards_to_switch_to(o: dict[str, Any]) -> list[str]:
        first = o["payment_history"][0]
        return [
            k
            for k, m in shop.methods(o).items()
            if m["source"] == "gift_card"
            and k != first["payment_method_id"]
            and m["balance"] >= first["amount"]
        ]

    switchable = shop.order("pending", lambda o: bool(gift_cards_to_switch_to(o)))
    switch_to = gift_cards_to_switch_to(switchable)[0]
    s_pay = switchable["payment_history"][0]["payment_method_id"]

    def drop_method(user: str, method: str) -> tuple[str, Callable[[dict[str, Any]], None]]:
        return f"users/{user}", lambda row: row["payment_methods"].pop(method)

    def zero_balance(user: str, method: str) -> tuple[str, Callable[[dict[str, Any]], None]]:
        return f"users/{user}", lambda row: row["payment_methods"][method].update(balance=0.0)

    def items(
        order: dict[str, Any], old: list[str | None], new: list[str | None], pay: str | None
    ) -> dict[str, Any]:
        return {
            "order_id": order["order_id"],
            "item_ids": old,
            "new_item_ids": new,
            "payment_method_id": pay,
        }

    address = {
        "address1": "1 Elm St",
        "address2": "",
        "city": "Oslo",
        "state": "NA",
        "country": "Norway",
        "zip": "0150",
    }
    pid, did = pending["order_id"], delivered["order_id"]
    second_payment = {"transaction_type": "payment", "amount": 1.0, "payment_method_id": s_pay}
    paypal = {"source": "paypal", "id": "paypal_0000001"}
    c, e, m, p, r = (
        "cancel_pending_order",
        "exchange_delivered_order_items",
        "modify_pending_order_items",
        "modify_pending_order_payment",
        "return_delivered_order_items",
    )
    d_gc_item, p_gc_item = d_gc["items"][0], p_gc["items"][0]
    return {
        (c, "order_exists"): (c, {"order_id": none, "reason": "no longer needed"}, []),
        (c, "order_is_pending"): (c, {"order_id": did, "reason": "no longer needed"}, []),
        (c, "reason_is_valid"): (c, {"order_id": pid, "reason": "changed my mind"}, []),
        (c, "paid_with_known_methods"): (
            c,
            {"order_id": pid, "reason": "ordered by mistake"},
            [drop_method(pending["user_id"], p_pay)],
        ),
        (e, "order_exists"): (e, items({"order_id": none}, [], [], d_pay), []),
        (e, "order_is_delivered"): (e, items(pending, [p_item["item_id"]], [p_new], p_pay), []),
        (e, "items_in_order"): (e, items(delivered, ["0000000000"], [d_new], d_pay), []),
        (e, "same_number_of_items"): (e, items(delivered, [d_item["item_id"]], [], d_pay), []),
        (e, "new_items_of_same_product"): (
            e,
            items(delivered, [d_item["item_id"]], [shop.other_product_item(d_item)], d_pay),
            [],
        ),
        (e, "new_items_available"): (
            e,
            items(
                d_unavailable,
                [d_unavailable["items"][0]["item_id"]],
                [shop.alternative(d_unavailable["items"][0], available=False)],
                d_unavailable["payment_history"][0]["payment_method_id"],
            ),
            [],
        ),
        (e, "payment_method_exists"): (
            e,
            items(delivered, [d_item["item_id"]], [d_new], "credit_card_0000000"),
            [],
        ),
        (e, "gift_card_covers_difference"): (
            e,
            items(
                d_gc,
                [d_gc_item["item_id"]],
                [shop.alternative(d_gc_item, pricier=True)],
                shop.gift_card(d_gc),
            ),
            [zero_balance(d_gc["user_id"], str(shop.gift_card(d_gc)))],
        ),
        ("modify_pending_order_address", "order_exists"): (
            "modify_pending_order_address",
            {"order_id": none, **address},
            [],
        ),
        ("modify_pending_order_address", "order_status_contains_pending"): (
            "modify_pending_order_address",
            {"order_id": did, **address},
            [],
        ),
        (m, "order_exists"): (m, items({"order_id": none}, [], [], p_pay), []),
        (m, "order_is_pending"): (m, items(delivered, [d_item["item_id"]], [d_new], d_pay), []),
        (m, "items_in_order"): (m, items(pending, ["0000000000"], [p_new], p_pay), []),
        (m, "same_number_of_items"): (m, items(pending, [p_item["item_id"]], [], p_pay), []),
        (m, "new_items_differ"): (
            m,
            items(pending, [p_item["item_id"]], [p_item["item_id"]], p_pay),
            [],
        ),
        (m, "new_items_of_same_product"): (
            m,
            items(pending, [p_item["item_id"]], [shop.other_product_item(p_item)], p_pay),
            [],
        ),
        (m, "new_items_available"): (
            m,
            items(
                p_unavailable,
                [p_unavailable["items"][0]["item_id"]],
                [shop.alternative(p_unavailable["items"][0], available=False)],
                p_unavailable["payment_history"][0]["payment_method_id"],
            ),
            [],
        ),
        (m, "payment_method_exists"): (
            m,
            items(pending, [p_item["item_id"]], [p_new], "credit_card_0000000"),
            [],
        ),
        (m, "gift_card_covers_difference"): (
            m,
            items(
                p_gc,
                [p_gc_item["item_id"]],
                [shop.alternative(p_gc_item, pricier=True)],
                shop.gift_card(p_gc),
            ),
            [zero_balance(p_gc["user_id"], str(shop.gift_card(p_gc)))],
        ),
        (p, "order_exists"): (p, {"order_id": none, "payment_method_id": s_pay}, []),
        (p, "order_status_contains_pending"): (
            p,
            {"order_id": did, "payment_method_id": d_pay},
            [],
        ),
        (p, "payment_method_exists"): (
            p,
            {"order_id": switchable["order_id"], "payment_method_id": "gift_card_0000000"},
            [],
        ),
        (p, "single_payment"): (
            p,
            {"order_id": switchable["order_id"], "payment_method_id": switch_to},
            [
                (
                    f"orders/{switchable['order_id']}",
                    lambda row: row["payment_history"].append(second_payment),
                )
            ],
        ),
        (p, "payment_method_differs"): (
            p,
            {"order_id": switchable["order_id"], "payment_method_id": s_pay},
            [],
        ),
        (p, "gift_card_covers_total"): (
            p,
            {"order_id": switchable["order_id"], "payment_method_id": switch_to},
            [zero_balance(switchable["user_id"], switch_to)],
        ),
        (p, "original_payment_method_exists"): (
            p,
            {"order_id": switchable["order_id"], "payment_method_id": switch_to},
            [drop_method(switchable["user_id"], s_pay)],
        ),
        ("modify_user_address", "user_exists"): (
            "modify_user_address",
            {"user_id": "nobody_0", **address},
            [],
        ),
        (r, "order_exists"): (
            r,
            {"order_id": none, "item_ids": [], "payment_method_id": d_pay},
            [],
        ),
        (r, "order_is_delivered"): (
            r,
            {"order_id": pid, "item_ids": [p_item["item_id"]], "payment_method_id": p_pay},
            [],
        ),
        (r, "user_exists"): (
            r,
            {"order_id": did, "item_ids": [d_item["item_id"]], "payment_method_id": d_pay},
            [(f"orders/{did}", lambda row: row.update(user_id="nobody_0"))],
        ),
        (r, "payment_method_exists"): (
            r,
            {"order_id": did, "item_ids": [d_item["item_id"]], "payment_method_id": "paypal_0"},
            [],
        ),
        (r, "refund_to_original_or_gift_card"): (
            r,
            {
                "order_id": did,
                "item_ids": [d_item["item_id"]],
                "payment_method_id": "paypal_0000001",
            },
            [
                (
                    f"users/{delivered['user_id']}",
                    lambda row: row["payment_methods"].update(paypal_0000001=paypal),
                )
            ],
        ),
        (r, "items_in_order"): (
            r,
            {"order_id": did, "item_ids": ["0000000000"], "payment_method_id": d_pay},
            [],
        ),
    }


_ALL_CHECKS = [(tool, check.__name__) for tool, checks in PRECONDITIONS.items() for check in checks]


@pytest.mark.parametrize(("tool", "check"), _ALL_CHECKS, ids=[f"{t}-{c}" for t, c in _ALL_CHECKS])
def test_each_precondition_refuses_what_upstream_refuses(
    tool: str, check: str, env: RetailEnvironment, pristine: Export, store_url: str
) -> None:
    """Each precondition refuses its case before the tool runs, nothing is written, and the plain
    upstream tool refuses the same call too."""
    name, arguments, patches = _cases(Shop(pristine))[(tool, check)]
    checks = {c.__name__: c for c in PRECONDITIONS[tool]}
    for key, change in patches:
        _put(env, key, change)
    before = _rows(env)
    real = getattr(env.backend, name)
    calls = _spy(env, name)
    with _episode(env, store_url) as ep:
        with pytest.raises(hx.PreconditionFailed) as refused:
            env.tools[name](**arguments)
        assert refused.value.check == check
        assert refused.value.decision == "continue"
        assert refused.value.reason == inspect.getdoc(checks[check]).split("\n")[0]  # type: ignore[union-attr]
    assert ep.outcome == "committed"
    assert calls == []
    assert _rows(env) == before
    with pytest.raises(RetailError):
        real(**arguments)
    assert _rows(env) == before


def test_every_precondition_has_a_refusal_case(pristine: Export) -> None:
    """The refusal cases above cover every registered precondition of every write tool."""
    assert set(_cases(Shop(pristine))) == set(_ALL_CHECKS)


# -- compensation and rollback -----------------------------------------------------------------


def _seven_writes(shop: Shop) -> list[tuple[str, dict[str, Any]]]:
    """One accepted call of each write tool on distinct orders, three of them moving gift card
    balances."""
    used: set[str] = set()

    def fresh(status: str, test: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        order = shop.order(status, lambda o: o["order_id"] not in used and test(o))
        used.add(order["order_id"])
        used.add(order["user_id"])
        return order

    def paid_by_gift_card(o: dict[str, Any]) -> bool:
        method = shop.methods(o)[o["payment_history"][0]["payment_method_id"]]
        return o["user_id"] not in used and method["source"] == "gift_card"

    cancel = fresh("pending", paid_by_gift_card)
    items = fresh(
        "pending",
        lambda o: (
            o["user_id"] not in used
            and shop.gift_card(o) is not None
            and shop.alternative(o["items"][0]) is not None
        ),
    )
    payment = fresh(
        "pending",
        lambda o: (
            o["user_id"] not in used
            and any(
                m["source"] == "gift_card"
                and k != o["payment_history"][0]["payment_method_id"]
                and m["balance"] >= o["payment_history"][0]["amount"]
                for k, m in shop.methods(o).items()
            )
        ),
    )
    switch_to = next(
        k
        for k, m in shop.methods(payment).items()
        if m["source"] == "gift_card" and k != payment["payment_history"][0]["payment_method_id"]
    )
    address = fresh("pending", lambda o: True)
    exchange = fresh("delivered", lambda o: shop.alternative(o["items"][0]) is not None)
    ret = fresh("delivered", lambda o: True)
    where = {"address1": "1 Elm St", "address2": "", "city": "Oslo", "state": "NA"}
    where |= {"country": "Norway", "zip": "0150"}
    gift_card = str(shop.gift_card(items))
    pay = {o["order_id"]: o["payment_history"][0]["payment_method_id"] for o in (exchange, ret)}
    # Give the items' gift card enough for any difference: set in the environment below.
    return [
        ("cancel_pending_order", {"order_id": cancel["order_id"], "reason": "no longer needed"}),
        (
            "modify_pending_order_items",
            {
                "order_id": items["order_id"],
                "item_ids": [items["items"][0]["item_id"]],
                "new_item_ids": [shop.alternative(items["items"][0])],
                "payment_method_id": gift_card,
            },
        ),
        (
            "modify_pending_order_payment",
            {"order_id": payment["order_id"], "payment_method_id": switch_to},
        ),
        ("modify_pending_order_address", {"order_id": address["order_id"], **where}),
        ("modify_user_address", {"user_id": address["user_id"], **where}),
        (
            "exchange_delivered_order_items",
            {
                "order_id": exchange["order_id"],
                "item_ids": [exchange["items"][0]["item_id"]],
                "new_item_ids": [shop.alternative(exchange["items"][0])],
                "payment_method_id": pay[exchange["order_id"]],
            },
        ),
        (
            "return_delivered_order_items",
            {
                "order_id": ret["order_id"],
                "item_ids": [i["item_id"] for i in ret["items"]],
                "payment_method_id": pay[ret["order_id"]],
            },
        ),
    ]


def _fund_gift_cards(env: RetailEnvironment, calls: list[tuple[str, dict[str, Any]]]) -> None:
    """Top up the gift card paying the item change so it covers any difference (setup)."""
    order = env.state.get(f"orders/{calls[1][1]['order_id']}")
    assert order is not None
    method = calls[1][1]["payment_method_id"]
    _put(
        env,
        f"users/{order['user_id']}",
        lambda row: row["payment_methods"][method].update(balance=5000.0),
    )


def test_rollback_of_seven_writes_restores_the_original_export(
    env: RetailEnvironment, pristine: Export, store_url: str
) -> None:
    """Rolling back an episode that committed one call of each write tool (gift cards moved
    included) gives back the export from before, record order included."""
    calls = _seven_writes(Shop(pristine))
    _fund_gift_cards(env, calls)
    before = env.export()
    with _episode(env, store_url) as ep:
        for name, arguments in calls:
            env.tools[name](**arguments)
        changed = _changes(before, env.export())
        assert len(changed) == 10  # seven orders, three users (gift cards, address)
        ep.rollback()
    assert ep.outcome == "rolled_back"
    after = env.export()
    assert after == before
    assert json.dumps(after) == json.dumps(before)


@pytest.mark.parametrize("index", range(7), ids=lambda i: f"write-{i}")
def test_each_compensation_restores_the_before_rows(
    index: int, env: RetailEnvironment, pristine: Export, store_url: str
) -> None:
    """Each write's compensation alone, run on the committed transaction, restores exactly the
    rows it changed, byte for byte."""
    calls = _seven_writes(Shop(pristine))
    _fund_gift_cards(env, calls)
    before = _rows(env)
    name, arguments = calls[index]
    with _episode(env, store_url) as ep:
        env.tools[name](**arguments)
        assert _rows(env) != before
        ep.rollback()
    assert _rows(env) == before


def test_restore_before_inserts_deleted_rows_and_deletes_new_ones(
    env: RetailEnvironment, pristine: Export
) -> None:
    """The generic restore puts back a row the action deleted and removes one it created."""
    user_id = next(iter(pristine["users"]))
    key, new_key = f"users/{user_id}", "users/new_user_0"
    row = env.state.get(key)
    assert row is not None
    conn = env.state.connection
    conn.execute("DELETE FROM users WHERE user_id = ?", (user_id,))
    conn.execute(
        "INSERT INTO users VALUES (?, ?, ?, ?, ?, ?)",
        db.encode("users", {**row, "user_id": "new_user_0"}),
    )
    ctx = hx.Context("test", None, env.state, "episode")
    ctx.before = {key: row, new_key: None}
    ctx.after = {key: None, new_key: {**row, "user_id": "new_user_0"}}
    restore_before(conn, ctx)
    assert env.state.get(key) == row
    assert env.state.get(new_key) is None
    assert env.export()["users"] == pristine["users"]


# -- failures -----------------------------------------------------------------------------------


def test_silent_fault_with_no_write_is_detected(
    env: RetailEnvironment, pristine: Export, store_url: str
) -> None:
    """A tool that claims success without writing fails its postconditions (``silent``), is
    retried, and ends as a failed action with nothing changed."""
    name, arguments = _seven_writes(Shop(pristine))[0]
    real = env.backend.get_order_details
    monkey = {"calls": 0}

    def lying(order_id: str, reason: str) -> dict[str, Any]:
        monkey["calls"] += 1
        return {**real(order_id), "status": "cancelled"}  # claims it, writes nothing

    env.backend.cancel_pending_order = lying  # type: ignore[method-assign]
    with _episode(env, store_url) as ep:
        with pytest.raises(hx.ActionFailed) as failed:
            env.tools[name](**arguments)
    assert failed.value.failure_class == "silent"
    assert failed.value.decision == "continue"
    assert "order_is_cancelled" in failed.value.reason
    assert monkey["calls"] == 3  # the policy retries silent failures, then gives up
    assert ep.outcome == "committed"
    assert env.export() == pristine


def test_silent_fault_with_a_partial_write_is_detected_and_undone(
    env: RetailEnvironment, pristine: Export, store_url: str
) -> None:
    """A cancellation that marks the order cancelled but skips the gift card refund fails
    ``gift_card_balances_moved`` and its partial write is compensated."""
    name, arguments = _seven_writes(Shop(pristine))[0]
    backend = env.backend

    def no_refund(order_id: str, reason: str) -> dict[str, Any]:
        order = backend.get_order_details(order_id)
        history = order["payment_history"]
        order.update(status="cancelled", cancel_reason=reason)
        history += [{**p, "transaction_type": "refund"} for p in list(history)]
        env.state.connection.execute(
            "UPDATE orders SET status = ?, cancel_reason = ?, payment_history = ? "
            "WHERE order_id = ?",
            ("cancelled", reason, json.dumps(history), order_id),
        )
        return order

    backend.cancel_pending_order = no_refund  # type: ignore[method-assign]
    with _episode(env, store_url):
        with pytest.raises(hx.ActionFailed) as failed:
            env.tools[name](**arguments)
    assert failed.value.failure_class == "silent"
    assert "gift_card_balances_moved" in failed.value.reason
    assert env.export() == pristine


def test_items_postcondition_holds_only_for_upstream_pricing(
    env: RetailEnvironment, pristine: Export, store_url: str
) -> None:
    """The item-change postcondition states upstream's behaviour: a tool that prices each item
    as its own new variant (not the last one) is a silent fault when the prices differ."""
    shop = Shop(pristine)

    def candidate(o: dict[str, Any]) -> list[str] | None:
        if o["status"] != "pending" or len(o["items"]) < 2:
            return None
        new = [shop.alternative(i) for i in o["items"][:2]]
        if None in new:
            return None
        prices = [
            pristine["products"][i["product_id"]]["variants"][n]["price"]
            for i, n in zip(o["items"][:2], new, strict=True)
        ]
        return [str(n) for n in new] if prices[0] != prices[1] else None

    order_id, new_ids = next(
        (o["order_id"], c) for o in pristine["orders"].values() if (c := candidate(o)) is not None
    )
    chosen = pristine["orders"][order_id]
    arguments = {
        "order_id": order_id,
        "item_ids": [i["item_id"] for i in chosen["items"][:2]],
        "new_item_ids": new_ids,
        "payment_method_id": chosen["payment_history"][0]["payment_method_id"],
    }
    real = RetailTools.modify_pending_order_items

    def own_prices(**kw: Any) -> Any:
        result: dict[str, Any] = real(env.backend, **kw)
        items = result["items"]
        for item in items:
            product = pristine["products"][item["product_id"]]["variants"]
            if item["item_id"] in new_ids:
                item["price"] = product[item["item_id"]]["price"]
                item["options"] = product[item["item_id"]]["options"]
        env.state.connection.execute(
            "UPDATE orders SET items = ? WHERE order_id = ?", (json.dumps(items), order_id)
        )
        return result

    env.backend.modify_pending_order_items = own_prices  # type: ignore[method-assign,assignment]
    with _episode(env, store_url):
        with pytest.raises(hx.ActionFailed) as failed:
            env.tools["modify_pending_order_items"](**arguments)
        assert "items_swapped" in failed.value.reason
        del env.backend.modify_pending_order_items  # back to upstream's behaviour
        result = env.tools["modify_pending_order_items"](**arguments)
    last = pristine["products"][chosen["items"][1]["product_id"]]["variants"][new_ids[1]]
    assert [i["price"] for i in result["items"][:2]] == [last["price"]] * 2
    assert env.export()["orders"][order_id]["status"] == "pending (item modified)"


def test_write_outside_the_scope_is_a_scope_violation(
    env: RetailEnvironment, pristine: Export, store_url: str
) -> None:
    """A cancellation paid by card has only its order in scope: a tool that also touches the
    user is a scope failure, undone, and the policy rolls the episode back."""
    shop = Shop(pristine)
    order = shop.order(
        "pending",
        lambda o: (
            shop.methods(o)[o["payment_history"][0]["payment_method_id"]]["source"] != "gift_card"
        ),
    )
    real = env.backend.cancel_pending_order

    def meddling(order_id: str, reason: str) -> dict[str, Any]:
        result = real(order_id, reason)
        env.state.connection.execute(
            "UPDATE users SET email = 'x@example.com' WHERE user_id = ?", (order["user_id"],)
        )
        return result

    env.backend.cancel_pending_order = meddling  # type: ignore[method-assign]
    with _episode(env, store_url) as ep:
        with pytest.raises(hx.ScopeViolation) as violation:
            env.tools["cancel_pending_order"](order["order_id"], "no longer needed")
    assert violation.value.keys == [f"users/{order['user_id']}"]
    assert ep.outcome == "rolled_back"
    assert env.export() == pristine


def test_tool_error_is_a_failed_action_the_agent_sees(
    env: RetailEnvironment, pristine: Export, store_url: str
) -> None:
    """A RetailError is permanent: not retried, nothing written (the tool's transaction rolls
    back), decision continue, and the episode goes on."""
    name, arguments = _seven_writes(Shop(pristine))[0]
    calls: list[int] = []

    def refusing(order_id: str, reason: str) -> dict[str, Any]:
        calls.append(1)
        with env.backend._writing():
            env.state.connection.execute(
                "UPDATE orders SET status = 'cancelled' WHERE order_id = ?", (order_id,)
            )
            raise RetailError("Non-pending order cannot be cancelled")

    real = env.backend.cancel_pending_order
    env.backend.cancel_pending_order = refusing  # type: ignore[method-assign]
    with _episode(env, store_url) as ep:
        with pytest.raises(hx.ActionFailed) as failed:
            env.tools[name](**arguments)
        assert env.export() == pristine
        env.backend.cancel_pending_order = real  # type: ignore[method-assign]
        env.tools[name](**arguments)
    assert calls == [1]
    assert failed.value.failure_class == "fail_stop"
    assert failed.value.decision == "continue"
    assert isinstance(failed.value.errors[0], RetailError)
    assert ep.outcome == "committed"
    store = hx.Store(store_url)
    try:
        assert store.escalations() == []
    finally:
        store.close()


def test_transient_failures_are_retried_on_the_fake_clock(
    env: RetailEnvironment, pristine: Export, store_url: str
) -> None:
    """Two transient failures then success commit once after two waits; three exhaust the
    retries and end as a failed action with nothing written."""
    calls = _seven_writes(Shop(pristine))
    name, arguments = calls[3]  # modify_pending_order_address
    real = env.backend.modify_pending_order_address
    clock = FakeClock()
    flaky = Flaky(real, fail_on=[1, 2])
    env.backend.modify_pending_order_address = flaky  # type: ignore[method-assign]
    with _episode(env, store_url, clock=clock):
        env.tools[name](**arguments)
        assert flaky.calls == 3 and len(clock.sleeps) == 2
        user_name, user_args = calls[4]
        env.backend.modify_user_address = Flaky(  # type: ignore[method-assign]
            env.backend.modify_user_address, fail_on=[1, 2, 3]
        )
        with pytest.raises(hx.ActionFailed) as failed:
            env.tools[user_name](**user_args)
    assert failed.value.decision == "continue"
    assert len(failed.value.errors) == 3
    changed = _changes(pristine, env.export())
    assert list(changed) == [f"orders/{arguments['order_id']}"]


# -- idempotency keys ---------------------------------------------------------------------------


def test_repeated_identical_call_runs_again_as_upstream(
    env: RetailEnvironment, pristine: Export, store_url: str
) -> None:
    """A second identical cancellation is not answered from the record: it runs and is refused
    like upstream's, and an address set to A, then B, then A again ends on A."""
    calls = _seven_writes(Shop(pristine))
    name, arguments = calls[0]
    user = dict(calls[4][1])
    a = {**user, "city": "Oslo"}
    b = {**user, "city": "Bergen"}
    with _episode(env, store_url):
        env.tools[name](**arguments)
        with pytest.raises(hx.PreconditionFailed) as refused:
            env.tools[name](**arguments)
        assert refused.value.check == "order_is_pending"
        for address in (a, b, a):
            env.tools["modify_user_address"](**address)
    assert env.export()["users"][user["user_id"]]["address"]["city"] == "Oslo"


def test_resumed_episode_replaying_its_calls_runs_nothing_twice(
    env: RetailEnvironment, pristine: Export, store_url: str
) -> None:
    """Resuming an episode and replaying its calls from the start (identical calls included)
    answers each committed call from the record without running a tool."""
    user = dict(_seven_writes(Shop(pristine))[4][1])
    script = [{**user, "city": c} for c in ("Oslo", "Bergen", "Oslo")]
    with _episode(env, store_url) as first:
        results = [env.tools["modify_user_address"](**args) for args in script]
    after = env.export()
    ran = _spy(env, "modify_user_address")
    with _episode(env, store_url, episode_id=first.id, resume=True):
        again = [env.tools["modify_user_address"](**args) for args in script]
        assert ran == []
        env.tools["modify_user_address"](**script[1])  # a fourth call is new work
    assert again == results
    assert ran == ["modify_user_address"]
    assert env.export()["users"][user["user_id"]]["address"]["city"] == "Bergen"
    assert after["users"][user["user_id"]]["address"]["city"] == "Oslo"


class Crash(BaseException):
    """A process dying mid-call (not an Exception: nothing in the harness catches it)."""


def test_crash_after_the_effect_is_recovered_on_resume_without_running_again(
    env: RetailEnvironment, pristine: Export, store_url: str
) -> None:
    """A crash after the tool applied its effect but before the commit leaves an intent in
    doubt; on resume the postconditions find the effect and the call commits without
    re-running the tool."""
    name, arguments = _seven_writes(Shop(pristine))[0]
    real = env.backend.cancel_pending_order
    ran: list[int] = []

    def crashing(order_id: str, reason: str) -> dict[str, Any]:
        real(order_id, reason)
        ran.append(1)
        raise Crash

    env.backend.cancel_pending_order = crashing  # type: ignore[method-assign]
    with pytest.raises(Crash), _episode(env, store_url) as first:
        env.tools[name](**arguments)
    applied = env.export()
    assert applied != pristine
    env.backend.cancel_pending_order = real  # type: ignore[method-assign]
    with _episode(env, store_url, episode_id=first.id, resume=True) as resumed:
        assert len(resumed.in_doubt) == 1
        env.tools[name](**arguments)
        assert resumed.in_doubt == []
    assert ran == [1]
    assert env.export() == applied


# -- property: any sequence of calls, harness or not, ends the same -----------------------------


def _interacting_calls(data: Export) -> list[tuple[str, dict[str, Any]]]:
    """Write calls that interfere: one user's two pending orders and a delivered one, its gift
    card and another method, two addresses; some succeed, some fail, some only after others."""
    shop = Shop(data)

    def fits(user: dict[str, Any]) -> bool:
        orders = [data["orders"][o] for o in user["orders"]]
        sources = [m["source"] for m in user["payment_methods"].values()]
        return (
            "gift_card" in sources
            and len(sources) >= 2
            and sum(o["status"] == "pending" for o in orders) >= 2
            and any(o["status"] == "delivered" and shop.alternative(o["items"][0]) for o in orders)
        )

    user = next(u for u in data["users"].values() if fits(u))
    orders = [data["orders"][o] for o in user["orders"]]
    p1, p2 = [o for o in orders if o["status"] == "pending"][:2]
    d = next(o for o in orders if o["status"] == "delivered" and shop.alternative(o["items"][0]))
    gift = next(k for k, m in user["payment_methods"].items() if m["source"] == "gift_card")
    other = next(k for k, m in user["payment_methods"].items() if m["source"] != "gift_card")
    where = {"address2": "", "state": "NA", "country": "Norway", "zip": "0150"}
    a = {"address1": "1 Elm St", "city": "Oslo", **where}
    b = {"address1": "2 Oak St", "city": "Bergen", **where}
    calls: list[tuple[str, dict[str, Any]]] = []
    for order, reason in ((p1, "no longer needed"), (p2, "ordered by mistake")):
        oid = order["order_id"]
        calls += [
            ("cancel_pending_order", {"order_id": oid, "reason": reason}),
            ("modify_pending_order_address", {"order_id": oid, **a}),
            ("modify_pending_order_address", {"order_id": oid, **b}),
            ("modify_pending_order_payment", {"order_id": oid, "payment_method_id": gift}),
            ("modify_pending_order_payment", {"order_id": oid, "payment_method_id": other}),
        ]
        item = next((i for i in order["items"] if shop.alternative(i)), None)
        if item is not None:
            for method in (gift, other):
                change = {"item_ids": [item["item_id"]], "new_item_ids": [shop.alternative(item)]}
                calls.append(
                    (
                        "modify_pending_order_items",
                        {"order_id": oid, **change, "payment_method_id": method},
                    )
                )
    item = d["items"][0]
    original = d["payment_history"][0]["payment_method_id"]
    for method in (gift, original):
        calls += [
            (
                "exchange_delivered_order_items",
                {
                    "order_id": d["order_id"],
                    "item_ids": [item["item_id"]],
                    "new_item_ids": [shop.alternative(item)],
                    "payment_method_id": method,
                },
            ),
            (
                "return_delivered_order_items",
                {
                    "order_id": d["order_id"],
                    "item_ids": [item["item_id"]],
                    "payment_method_id": method,
                },
            ),
        ]
    calls += [
        ("modify_user_address", {"user_id": user["user_id"], **a}),
        ("modify_user_address", {"user_id": user["user_id"], **b}),
    ]
    return calls


@settings(max_examples=25, deadline=None, derandomize=True)
@given(picks=st.lists(st.integers(min_value=0, max_value=10_000), max_size=8))
def test_any_call_sequence_ends_as_upstream_and_rolls_back(
    picks: list[int], pristine: Export, shared_store: hx.Store
) -> None:
    """Any sequence of interfering write calls (repeats included) fails and changes through the
    harness exactly as with the plain tools, and rolling the episode back restores every row
    byte for byte."""
    pool = _interacting_calls(pristine)
    calls = [pool[i % len(pool)] for i in picks]
    with RetailEnvironment() as plain, RetailEnvironment() as env:
        fresh_rows = _rows(env)
        expected: list[bool] = []
        for name, arguments in calls:
            try:
                getattr(plain.backend, name)(**arguments)
                expected.append(True)
            except RetailError:
                expected.append(False)
        with _episode(env, shared_store) as ep:
            oks: list[bool] = []
            for name, arguments in calls:
                try:
                    env.tools[name](**arguments)
                    oks.append(True)
                except FAILED:
                    oks.append(False)
            assert oks == expected
            assert _rows(env) == _rows(plain)
            ep.rollback()
        assert _rows(env) == fresh_rows

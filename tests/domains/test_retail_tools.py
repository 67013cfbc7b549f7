"""Fidelity of the plain retail tools and database to tau2-bench (``harness.domains.retail``)."""

from __future__ import annotations

import inspect
import json
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.domains import records
from harness.domains.retail import db
from harness.domains.retail.tools import (
    READ_TOOLS,
    TOOL_TYPES,
    WRITE_TOOLS,
    RetailError,
    RetailTools,
    _fold,
)

REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "data" / "tau2-retail"
GOLD_JSON = REFERENCE / "gold.json"
NO_GOLD = f"reference data absent: {GOLD_JSON} (the shared folder beside the repository)"


def _gold_tasks() -> list[Any]:
    if not GOLD_JSON.exists():
        return [pytest.param(None, marks=pytest.mark.skip(reason=NO_GOLD))]
    tasks = json.loads(GOLD_JSON.read_text(encoding="utf-8"))
    return [pytest.param(task, id=f"task-{task['task_id']}") for task in tasks]


@pytest.fixture(scope="module")
def pristine() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(db.DEFAULT_DB_JSON.read_text(encoding="utf-8"))
    return data


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    connection = db.connect(db.fresh_copy(tmp_path / "retail.sqlite"))
    yield connection
    connection.close()


@pytest.fixture
def tools(conn: sqlite3.Connection) -> RetailTools:
    return RetailTools(conn)


@pytest.mark.parametrize("task", _gold_tasks())
def test_replaying_reference_actions_matches_upstream(
    task: dict[str, Any], tools: RetailTools, pristine: dict[str, Any]
) -> None:
    """Replaying a task's reference actions fails, returns and changes exactly what tau2 did."""
    for index, action in enumerate(task["actions"]):
        where = f"action {index} ({action['name']})"
        try:
            result = getattr(tools, action["name"])(**action["arguments"])
        except RetailError as error:
            assert not action["ok"], f"{where} failed: {error}"
            assert action["error"] == f"ValueError: {error}", where
            continue
        assert action["ok"], f"{where} succeeded where upstream raised {action['error']}"
        if "result" in action:
            assert result == action["result"], where
    after = db.export(tools.conn)
    assert db.changes_fingerprint(db.changes(pristine, after)) == task["changes_fingerprint"]


@pytest.mark.skipif(not GOLD_JSON.exists(), reason=NO_GOLD)
def test_fingerprint_reproduces_gold_from_its_changes() -> None:
    """changes_fingerprint of every gold task's changes equals the fingerprint gold records."""
    for task in json.loads(GOLD_JSON.read_text(encoding="utf-8")):
        assert db.changes_fingerprint(task["changes"]) == task["changes_fingerprint"]


def test_export_of_fresh_copy_round_trips_db_json(
    conn: sqlite3.Connection, pristine: dict[str, Any]
) -> None:
    """Exporting a fresh copy gives db.json back exactly, down to key order."""
    exported = db.export(conn)
    assert exported == pristine
    assert json.dumps(exported) == json.dumps(pristine)


def test_fresh_copies_are_independent(tmp_path: Path, pristine: dict[str, Any]) -> None:
    """A write to one fresh copy shows neither in another copy nor in later copies."""
    first = db.connect(db.fresh_copy(tmp_path / "first.sqlite"))
    second = db.connect(db.fresh_copy(tmp_path / "second.sqlite"))
    user_id = next(iter(pristine["users"]))
    RetailTools(first).modify_user_address(user_id, "1 Elm St", "", "Oslo", "NA", "Norway", "0150")
    third = db.connect(db.fresh_copy(tmp_path / "third.sqlite"))
    assert db.export(first)["users"][user_id]["address"]["city"] == "Oslo"
    assert db.export(second) == pristine
    assert db.export(third) == pristine
    for connection in (first, second, third):
        connection.close()


def test_template_is_built_once_and_rebuilt_when_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """template_path returns the same file each time and rebuilds it if it was deleted; a copy
    made while it is gone rebuilds it too. (In a temporary folder of its own: the shared
    template is in use by every other process of the machine.)"""
    monkeypatch.setattr(records.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(records, "_templates", {})
    path = db.template_path()
    assert path.is_relative_to(tmp_path)
    assert db.template_path() == path
    path.unlink()
    assert db.template_path() == path
    assert path.exists()
    real = db.DATABASE.template_path
    calls = []

    def vanishing(json_path: Any = None) -> Path:
        found = real(json_path)
        if not calls:
            found.unlink()  # (gone between finding it and copying it)
        calls.append(found)
        return found

    monkeypatch.setattr(db.DATABASE, "template_path", vanishing)
    copy = db.fresh_copy(tmp_path / "copy.sqlite")
    assert len(calls) == 2 and copy.stat().st_size == path.stat().st_size


def test_json_columns_are_declared_json(conn: sqlite3.Connection) -> None:
    """Every nested field has declared type JSON and columns follow upstream's field order."""
    for table, columns in db.TABLES.items():
        info = conn.execute(f"PRAGMA table_info({table})").fetchall()
        assert [(row[1], row[2]) for row in info] == [(c.name, c.type) for c in columns]
    declared = dict(
        (row[1], row[2]) for row in conn.execute("PRAGMA table_info(orders)").fetchall()
    )
    assert declared["items"] == "JSON"
    assert declared["exchange_price_difference"] == "REAL"


def test_failing_write_leaves_database_unchanged(
    conn: sqlite3.Connection, tools: RetailTools, pristine: dict[str, Any]
) -> None:
    """A write that fails after it began changing things (a refund to a gift card done, the
    next refund's method missing) rolls back every change it made."""
    order_id, order = next(
        (oid, o)
        for oid, o in pristine["orders"].items()
        if o["status"] == "pending"
        and o["payment_history"][0]["payment_method_id"].startswith("gift_card")
    )
    history = order["payment_history"] + [
        {"transaction_type": "payment", "amount": 1.0, "payment_method_id": "credit_card_missing"}
    ]
    conn.execute(
        "UPDATE orders SET payment_history = ? WHERE order_id = ?",
        (json.dumps(history), order_id),
    )
    before = db.export(conn)
    with pytest.raises(RetailError, match="Payment method not found"):
        tools.cancel_pending_order(order_id, "no longer needed")
    assert not conn.in_transaction
    assert db.export(conn) == before


def test_write_inside_callers_transaction_uses_a_savepoint(
    conn: sqlite3.Connection, tools: RetailTools, pristine: dict[str, Any]
) -> None:
    """Inside a caller's transaction a write joins it: a failure undoes only the tool's part and
    the caller's rollback undoes the rest."""
    user_id = next(iter(pristine["users"]))
    conn.execute("BEGIN IMMEDIATE")
    tools.modify_user_address(user_id, "1 Elm St", "", "Oslo", "NA", "Norway", "0150")
    with pytest.raises(RetailError, match="Order not found"):
        tools.cancel_pending_order("#W0000000", "no longer needed")
    assert conn.in_transaction
    assert tools.get_user_details(user_id)["address"]["city"] == "Oslo"
    conn.execute("ROLLBACK")
    assert db.export(conn) == pristine


def test_name_and_zip_find_the_first_user_of_that_name_with_that_zip(
    tools: RetailTools, pristine: dict[str, Any]
) -> None:
    """Upstream's search, for every user: the first user in the database's order whose names
    match (ignoring case and accents) and whose zip is the same string; a zip that differs,
    even as a number, finds nobody."""
    users = list(pristine["users"].items())
    for _, user in users:
        first, last = user["name"]["first_name"], user["name"]["last_name"]
        zip_code = user["address"]["zip"]
        expected = next(
            uid
            for uid, other in users
            if (_fold(other["name"]["first_name"]), _fold(other["name"]["last_name"]))
            == (_fold(first), _fold(last))
            and other["address"]["zip"] == zip_code
        )
        assert tools.find_user_id_by_name_zip(first.lower(), last.upper(), zip_code) == expected
    user = users[0][1]
    first, last, zip_code = (
        user["name"]["first_name"],
        user["name"]["last_name"],
        user["address"]["zip"],
    )
    for wrong in (zip_code + " ", int(zip_code), "0" + zip_code):
        with pytest.raises(RetailError, match="User not found"):
            tools.find_user_id_by_name_zip(first, last, wrong)  # type: ignore[arg-type]


def test_read_tools_never_write(
    conn: sqlite3.Connection, tools: RetailTools, pristine: dict[str, Any]
) -> None:
    """Read and generic tools change no row and leave no transaction open."""
    before = conn.total_changes
    some_user = next(iter(pristine["users"].values()))
    user_id = tools.find_user_id_by_email(some_user["email"].upper())
    user = tools.get_user_details(user_id)
    assert user == some_user
    first, last = user["name"]["first_name"], user["name"]["last_name"]
    zip_code = user["address"]["zip"]
    assert tools.find_user_id_by_name_zip(first.upper(), last.lower(), zip_code) == user_id
    order = tools.get_order_details(user["orders"][0])
    product = tools.get_product_details(order["items"][0]["product_id"])
    item_id = order["items"][0]["item_id"]
    assert tools.get_item_details(item_id) == product["variants"][item_id]
    assert len(json.loads(tools.list_all_product_types())) == 50
    assert tools.calculate("(2 + 3) * 1.5 / 2") == "3.75"
    assert tools.transfer_to_human_agents("needs a person") == "Transfer successful"
    assert conn.total_changes == before
    assert not conn.in_transaction


def test_read_tools_raise_upstream_messages(tools: RetailTools) -> None:
    """Lookups of unknown ids raise RetailError with upstream's messages."""
    cases: list[tuple[Callable[..., object], tuple[str, ...], str]] = [
        (tools.get_order_details, ("#W0000000",), "Order not found"),
        (tools.get_user_details, ("nobody_0",), "User not found"),
        (tools.get_product_details, ("0",), "Product not found"),
        (tools.get_item_details, ("0",), "Item not found"),
        (tools.find_user_id_by_email, ("nobody@example.com",), "User not found"),
        (tools.find_user_id_by_name_zip, ("No", "Body", "00000"), "User not found"),
        (tools.calculate, ("2 + x",), "Invalid characters in expression"),
    ]
    for tool, args, message in cases:
        with pytest.raises(RetailError) as caught:
            tool(*args)
        assert str(caught.value) == message
    with pytest.raises(RetailError):
        tools.calculate("1 / 0")


def test_modify_items_gives_every_item_the_last_variant(
    tools: RetailTools, pristine: dict[str, Any]
) -> None:
    """Like upstream, modify_pending_order_items prices every modified item as the last new
    item, while the payment records the true, unrounded difference."""
    products = pristine["products"]

    def other_variant(item: dict[str, Any]) -> dict[str, Any] | None:
        variants = products[item["product_id"]]["variants"].values()
        return next(
            (v for v in variants if v["available"] and v["item_id"] != item["item_id"]), None
        )

    def candidate(order: dict[str, Any]) -> list[dict[str, Any]] | None:
        if order["status"] != "pending" or len(order["items"]) < 2:
            return None
        found = [other_variant(item) for item in order["items"][:2]]
        variants = [v for v in found if v is not None]
        if len(variants) < 2 or variants[0]["price"] == variants[1]["price"]:
            return None
        return variants

    order_id, order, new = next(
        (oid, o, c) for oid, o in pristine["orders"].items() if (c := candidate(o)) is not None
    )
    items = order["items"][:2]
    payment_id = order["payment_history"][0]["payment_method_id"]
    result = tools.modify_pending_order_items(
        order_id, [i["item_id"] for i in items], [v["item_id"] for v in new], payment_id
    )
    last = new[-1]
    assert [i["price"] for i in result["items"][:2]] == [last["price"], last["price"]]
    assert [i["options"] for i in result["items"][:2]] == [last["options"], last["options"]]
    true_diff = (new[0]["price"] - items[0]["price"]) + (new[1]["price"] - items[1]["price"])
    assert result["payment_history"][-1]["amount"] == abs(true_diff)
    assert result["status"] == "pending (item modified)"


def test_tool_lists_name_every_public_method_once() -> None:
    """READ_TOOLS and WRITE_TOOLS partition exactly the public methods of RetailTools."""
    public = {
        name
        for name, _ in inspect.getmembers(RetailTools, inspect.isfunction)
        if not name.startswith("_")
    }
    assert set(READ_TOOLS) | set(WRITE_TOOLS) == public == set(TOOL_TYPES)
    assert not set(READ_TOOLS) & set(WRITE_TOOLS)
    assert len(WRITE_TOOLS) == 7


def test_connection_must_leave_transactions_to_the_tools(tmp_path: Path) -> None:
    """RetailTools refuses a connection whose sqlite3 module opens transactions implicitly."""
    connection = sqlite3.connect(db.fresh_copy(tmp_path / "retail.sqlite"))
    with pytest.raises(ValueError, match="isolation_level=None"):
        RetailTools(connection)
    connection.close()


def test_changes_compares_without_null_keys_and_reports_final_values() -> None:
    """changes ignores fields set to null, keys records table/id, and maps removals to None."""
    before = {"orders": {"#1": {"a": 1}, "#2": {"a": 1}, "#3": {"a": 1}}}
    after = {"orders": {"#1": {"a": 1, "b": None}, "#2": {"a": 2, "b": None}, "#4": {"a": 1}}}
    assert db.changes(before, after) == {
        "orders/#2": {"a": 2},
        "orders/#4": {"a": 1},
        "orders/#3": None,
    }
    assert db.changes_fingerprint({"x": {"a": 71.96000000000001, "b": None}}) == (
        db.changes_fingerprint({"x": {"a": 71.96}})
    )


def test_an_image_of_a_template_removed_meanwhile_is_built_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The template found, then removed before its bytes were read (another process
    cleaning the temporary folder): the image is built again and read, once."""
    monkeypatch.setattr(records, "_images", {})
    real = db.DATABASE.template_path
    asked: list[object] = []

    def gone_the_first_time(db_json_path: object = None) -> Path:
        asked.append(db_json_path)
        return tmp_path / "removed.sqlite" if len(asked) == 1 else real(db_json_path)  # type: ignore[arg-type]

    monkeypatch.setattr(db.DATABASE, "template_path", gone_the_first_time)
    image = db.DATABASE.image()
    assert image.startswith(b"SQLite format 3\x00") and image[18:20] == b"\x01\x01"
    assert len(asked) == 2


@pytest.mark.parametrize("suite_name", ["retail", "airline"])
def test_each_environment_has_write_actions_of_its_own(suite_name: str) -> None:
    """Environments copy their write actions from ones made once a process: each copy calls
    its own environment's tools, scopes and undoes in its own database, keys its own calls,
    and a check registered on one environment's action is on no other's."""
    import harness as hx

    suite = hx.load_suite(suite_name, check_references=False)
    first, second = suite.new_environment(), suite.new_environment()
    try:
        assert set(first.actions) == set(second.actions) and len(first.actions) >= 6
        for name, act in first.actions.items():
            other = second.actions[name]
            assert act is not other and act.fn is not other.fn
            assert act.writes is not other.writes and callable(act.writes)
            assert act.compensate is not other.compensate
            assert act.recovered_result is not other.recovered_result
            assert act.idempotency_key.__self__ is not other.idempotency_key.__self__
            assert act.preconditions == other.preconditions and act.preconditions
            assert act.preconditions is not other.preconditions
            assert act.schema == other.schema and act.__wrapped__ is act.fn
            assert inspect.signature(act) == inspect.signature(other)
        name = next(iter(first.actions))
        first.actions[name].precondition(lambda ctx: False)
        assert len(second.actions[name].preconditions) == len(first.actions[name].preconditions) - 1
        third = suite.new_environment()
        assert third.actions[name].preconditions == second.actions[name].preconditions
        third.close()
        # Each action's function reaches its own environment's tools (patched on one only).
        first.backend.__dict__[name] = lambda *a, **k: "first's"
        assert first.actions[name].fn() == "first's"
        assert second.actions[name].fn is not first.actions[name].fn
    finally:
        first.close()
        second.close()


def test_an_environment_closed_is_freed_whichever_made_the_actions_first() -> None:
    """The actions kept to copy from hold no environment: the first one made in a process
    (whose actions were the first) is freed once closed, its database with it."""
    import gc
    import weakref

    from harness.domains import tau2
    from harness.domains.retail.environment import RetailEnvironment

    tau2._PROTOTYPES.clear()
    env = RetailEnvironment()
    assert tau2._PROTOTYPES  # (its actions were the first made)
    backend, state = weakref.ref(env.backend), weakref.ref(env.state)
    env.close()
    del env
    gc.collect()
    assert backend() is None and state() is None
    again = RetailEnvironment()  # (copied from the kept ones, and working)
    try:
        assert again.actions["cancel_pending_order"].fn is not tau2._detached
    finally:
        again.close()

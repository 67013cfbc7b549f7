"""The seven retail write tools as transactional actions (``hx.action``).

:func:`build_actions` wraps each write tool of a :class:`RetailTools` in an :class:`hx.Action`
with upstream's name, arguments and docstring, and gives it what a transaction needs:

- ``writes``: the order (``orders/{order_id}``), plus the order's user (``users/<user_id>``)
  only when a gift card balance moves; ``users/{user_id}`` for ``modify_user_address``.
- Preconditions named after the policy's rules, mirroring upstream's validations (never stricter:
  a call upstream accepts passes all of them; a call upstream refuses is refused by one of them
  or by the tool's own :class:`RetailError`, which leaves no effect because every write tool
  runs in one SQLite transaction).
- Postconditions that check the database afterwards (``ctx.before`` / ``ctx.after``), never the
  tool's return value. They state upstream's behaviour, bugs included: every item changed by
  ``modify_pending_order_items`` takes the price and options of the *last* new item.
- One generic compensation that writes back the before-row of every row the action changed.
- Idempotency keys: the canonical hash of the arguments plus the *occurrence number* of that
  identical call in the episode (see :class:`harness.domains.base.OccurrenceKeys`).

A tool's :class:`RetailError` is a permanent ``fail_stop`` failure (not in ``Retry.on``); with
the default :class:`hx.Policy` it ends as :class:`hx.ActionFailed` with decision ``continue``
(the agent is told and may adapt). It is not escalated, because every action here has a
compensation (the policy's ``unsafe`` decision applies only to actions with neither a key nor a
compensation).
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import harness as hx
from harness.domains import tau2
from harness.domains.retail.db import DATABASE, Record
from harness.domains.retail.tools import WRITE_TOOLS, RetailTools

__all__ = ["POSTCONDITIONS", "PRECONDITIONS", "build_actions", "restore_before"]

Check = Callable[[hx.Context], bool]

_CANCEL_REASONS: Final = frozenset({"no longer needed", "ordered by mistake"})


# -- reading state ---------------------------------------------------------------------------


def _order(ctx: hx.Context) -> Record | None:
    order: Record | None = ctx.state.get(f"orders/{ctx.args.order_id}")
    return order


def _user(ctx: hx.Context, user_id: str) -> Record | None:
    user: Record | None = ctx.state.get(f"users/{user_id}")
    return user


def _methods(ctx: hx.Context, order: Record) -> dict[str, Record]:
    user = _user(ctx, order["user_id"])
    return {} if user is None else dict(user["payment_methods"])


def _is_gift_card(method: Mapping[str, Any] | None) -> bool:
    return method is not None and method.get("source") == "gift_card"


def _find_item(items: Sequence[Record], item_id: str) -> Record | None:
    return next((item for item in items if item["item_id"] == item_id), None)


def _variant(ctx: hx.Context, order: Record, item_id: str, new_item_id: str) -> Record | None:
    """The variant ``new_item_id`` of the product of the order's item ``item_id``, if any."""
    item = _find_item(order["items"], item_id)
    if item is None:
        return None
    product = ctx.state.get(f"products/{item['product_id']}")
    if product is None:
        return None
    variant: Record | None = product["variants"].get(new_item_id)
    return variant


def _price_difference(ctx: hx.Context, order: Record) -> float:
    """Sum of new minus old prices over the pairs, in upstream's order (not rounded)."""
    diff: float = 0
    for item_id, new_item_id in zip(ctx.args.item_ids, ctx.args.new_item_ids, strict=True):
        item = _find_item(order["items"], item_id)
        variant = _variant(ctx, order, item_id, new_item_id)
        if item is None or variant is None:
            raise LookupError(f"item {item_id} -> {new_item_id} has no price")
        diff += variant["price"] - item["price"]
    return diff


def _payment(transaction_type: str, amount: float, payment_method_id: str) -> Record:
    return {
        "transaction_type": transaction_type,
        "amount": float(amount),
        "payment_method_id": payment_method_id,
    }


def _address(args: Any) -> Record:
    return {
        "address1": args.address1,
        "address2": args.address2,
        "city": args.city,
        "country": args.country,
        "state": args.state,
        "zip": args.zip,
    }


# -- scopes ----------------------------------------------------------------------------------


_MONEY_TOOLS: Final = frozenset(
    {"cancel_pending_order", "modify_pending_order_items", "modify_pending_order_payment"}
)
"""Write tools that may move gift card balances (the others only change their one row)."""


def _gift_cards_moved(state: Any, name: str, args: Any) -> bool:
    """Whether the call, if it succeeds, changes a gift card balance of the order's user."""
    order = state.get(f"orders/{args.order_id}")
    if order is None:
        return False
    user = state.get(f"users/{order['user_id']}")
    methods: Mapping[str, Record] = {} if user is None else user["payment_methods"]
    if name == "cancel_pending_order":
        ids = [p["payment_method_id"] for p in order["payment_history"]]
    elif name == "modify_pending_order_items":
        ids = [args.payment_method_id]
    else:  # modify_pending_order_payment: the new method pays, the old one is refunded
        ids = [args.payment_method_id]
        ids += [p["payment_method_id"] for p in order["payment_history"][:1]]
    return any(_is_gift_card(methods.get(i)) for i in ids)


def _scope(state: Any, name: str) -> Callable[[Any], list[str]]:
    """The ``writes`` function of the tool ``name``: the rows it may change, as tight as known."""

    def writes(args: Any) -> list[str]:
        if name == "modify_user_address":
            return [f"users/{args.user_id}"]
        keys = [f"orders/{args.order_id}"]
        if name in _MONEY_TOOLS and _gift_cards_moved(state, name, args):
            keys.append(f"users/{state.get(keys[0])['user_id']}")
        return keys

    writes.__name__ = f"{name}_writes"
    return writes


# -- preconditions (the policy's rules, as upstream enforces them) ---------------------------


def order_exists(ctx: hx.Context) -> bool:
    """The order id names an order."""
    return _order(ctx) is not None


def order_is_pending(ctx: hx.Context) -> bool:
    """The order's status is exactly 'pending' (cancel, modify items)."""
    order = _order(ctx)
    return order is not None and order["status"] == "pending"


def order_status_contains_pending(ctx: hx.Context) -> bool:
    """The order's status contains 'pending' (address and payment changes).

    Upstream's loose check, so a 'pending (item modified)' order still qualifies.
    """
    order = _order(ctx)
    return order is not None and "pending" in order["status"]


def order_is_delivered(ctx: hx.Context) -> bool:
    """The order's status is 'delivered' (return, exchange)."""
    order = _order(ctx)
    return order is not None and order["status"] == "delivered"


def reason_is_valid(ctx: hx.Context) -> bool:
    """The cancellation reason is 'no longer needed' or 'ordered by mistake'."""
    return ctx.args.reason in _CANCEL_REASONS


def paid_with_known_methods(ctx: hx.Context) -> bool:
    """Every method that paid the order still exists to receive its refund."""
    order = _order(ctx)
    if order is None:
        return False
    methods = _methods(ctx, order)
    return all(p["payment_method_id"] in methods for p in order["payment_history"])


def items_in_order(ctx: hx.Context) -> bool:
    """Each item id is asked for at most as many times as the order holds it."""
    order = _order(ctx)
    if order is None:
        return False
    held = Counter(item["item_id"] for item in order["items"])
    return all(n <= held[i] for i, n in Counter(ctx.args.item_ids).items())


def same_number_of_items(ctx: hx.Context) -> bool:
    """As many new items as items to change."""
    return len(ctx.args.item_ids) == len(ctx.args.new_item_ids)


def new_items_differ(ctx: hx.Context) -> bool:
    """Each new item differs from the item it replaces."""
    pairs = zip(ctx.args.item_ids, ctx.args.new_item_ids, strict=False)
    return all(old != new for old, new in pairs)


def new_items_of_same_product(ctx: hx.Context) -> bool:
    """Each new item is a variant of the product of the item it replaces."""
    order = _order(ctx)
    if order is None:
        return False
    pairs = zip(ctx.args.item_ids, ctx.args.new_item_ids, strict=False)
    return all(_variant(ctx, order, old, new) is not None for old, new in pairs)


def new_items_available(ctx: hx.Context) -> bool:
    """Each new item is available."""
    order = _order(ctx)
    if order is None:
        return False
    pairs = zip(ctx.args.item_ids, ctx.args.new_item_ids, strict=False)
    return all((v := _variant(ctx, order, old, new)) and v["available"] for old, new in pairs)


def payment_method_exists(ctx: hx.Context) -> bool:
    """The payment method is one of the order's user's methods."""
    order = _order(ctx)
    return order is not None and ctx.args.payment_method_id in _methods(ctx, order)


def gift_card_covers_difference(ctx: hx.Context) -> bool:
    """A gift card paying the price difference has enough balance for it.

    Exchanges compare the difference rounded to cents, item changes the exact sum, as upstream.
    """
    order = _order(ctx)
    if order is None:
        return False
    method = _methods(ctx, order).get(ctx.args.payment_method_id)
    if not _is_gift_card(method):
        return True
    assert method is not None
    diff = _price_difference(ctx, order)
    if ctx.action == "exchange_delivered_order_items":
        diff = round(diff, 2)
    return bool(method["balance"] >= diff)


def single_payment(ctx: hx.Context) -> bool:
    """The order has exactly one payment (one method to switch away from)."""
    order = _order(ctx)
    if order is None:
        return False
    history = order["payment_history"]
    return len(history) == 1 and history[0]["transaction_type"] == "payment"


def payment_method_differs(ctx: hx.Context) -> bool:
    """The new payment method is not the current one."""
    order = _order(ctx)
    if order is None or not order["payment_history"]:
        return False
    return bool(order["payment_history"][0]["payment_method_id"] != ctx.args.payment_method_id)


def gift_card_covers_total(ctx: hx.Context) -> bool:
    """A gift card that is to pay the order has the balance for its total."""
    order = _order(ctx)
    if order is None or not order["payment_history"]:
        return False
    method = _methods(ctx, order).get(ctx.args.payment_method_id)
    if not _is_gift_card(method):
        return True
    assert method is not None
    return bool(method["balance"] >= order["payment_history"][0]["amount"])


def original_payment_method_exists(ctx: hx.Context) -> bool:
    """The method that paid the order still exists (it gets the refund)."""
    order = _order(ctx)
    if order is None or not order["payment_history"]:
        return False
    return order["payment_history"][0]["payment_method_id"] in _methods(ctx, order)


def user_exists(ctx: hx.Context) -> bool:
    """The user id names a user (for returns: the order's user)."""
    if ctx.action == "modify_user_address":
        return _user(ctx, ctx.args.user_id) is not None
    order = _order(ctx)
    return order is not None and _user(ctx, order["user_id"]) is not None


def refund_to_original_or_gift_card(ctx: hx.Context) -> bool:
    """The refund goes to the order's original payment method or to a gift card."""
    order = _order(ctx)
    if order is None:
        return False
    method = _methods(ctx, order).get(ctx.args.payment_method_id)
    if _is_gift_card(method):
        return True
    history = order["payment_history"]
    return bool(history) and history[0]["payment_method_id"] == ctx.args.payment_method_id


# Upstream's validation order, one rule per check; the first false one names the refusal.
PRECONDITIONS: Final[Mapping[str, tuple[Check, ...]]] = {
    "cancel_pending_order": (
        order_exists,
        order_is_pending,
        reason_is_valid,
        paid_with_known_methods,
    ),
    "exchange_delivered_order_items": (
        order_exists,
        order_is_delivered,
        items_in_order,
        same_number_of_items,
        new_items_of_same_product,
        new_items_available,
        payment_method_exists,
        gift_card_covers_difference,
    ),
    "modify_pending_order_address": (order_exists, order_status_contains_pending),
    "modify_pending_order_items": (
        order_exists,
        order_is_pending,
        items_in_order,
        same_number_of_items,
        new_items_differ,
        new_items_of_same_product,
        new_items_available,
        payment_method_exists,
        gift_card_covers_difference,
    ),
    "modify_pending_order_payment": (
        order_exists,
        order_status_contains_pending,
        payment_method_exists,
        single_payment,
        payment_method_differs,
        gift_card_covers_total,
        original_payment_method_exists,
    ),
    "modify_user_address": (user_exists,),
    "return_delivered_order_items": (
        order_exists,
        order_is_delivered,
        user_exists,
        payment_method_exists,
        refund_to_original_or_gift_card,
        items_in_order,
    ),
}
"""Each write tool's preconditions, in upstream's validation order."""


# -- postconditions (checked on the rows after execution) ------------------------------------


def _order_key(ctx: hx.Context) -> str:
    return f"orders/{ctx.args.order_id}"


def _rows(ctx: hx.Context, key: str) -> tuple[Record, Record] | None:
    before, after = ctx.before.get(key), ctx.after.get(key)
    if before is None or after is None:
        return None
    return before, after


def _only_changed(before: Record, after: Record, fields: Sequence[str]) -> bool:
    """Whether ``after`` equals ``before`` outside ``fields``."""
    return set(before) == set(after) and all(
        before[k] == after[k] for k in before if k not in fields
    )


def _expected_balances(ctx: hx.Context, order: Record) -> dict[str, float]:
    """Gift card balances after the action, by upstream's arithmetic (each move rounded)."""
    user = ctx.before.get(f"users/{order['user_id']}")
    if user is None:
        return {}
    methods: Mapping[str, Record] = user["payment_methods"]
    balances = {k: m["balance"] for k, m in methods.items() if _is_gift_card(m)}
    moves: list[tuple[str, float]] = []
    if ctx.action == "cancel_pending_order":
        moves = [(p["payment_method_id"], p["amount"]) for p in order["payment_history"]]
    elif ctx.action == "modify_pending_order_items":
        moves = [(ctx.args.payment_method_id, -_price_difference(ctx, order))]
    elif ctx.action == "modify_pending_order_payment":
        amount = order["payment_history"][0]["amount"]
        old = order["payment_history"][0]["payment_method_id"]
        moves = [(ctx.args.payment_method_id, -amount), (old, amount)]
    for method_id, amount in moves:
        if method_id in balances:
            balances[method_id] = round(balances[method_id] + amount, 2)
    return balances


def gift_card_balances_moved(ctx: hx.Context) -> bool:
    """Each gift card involved moved by its exact amount, and nothing else of the user changed.

    When no gift card is involved the user is outside the scope, so the scope check covers it.
    """
    order = ctx.before.get(_order_key(ctx))
    if order is None:
        return False
    user_key = f"users/{order['user_id']}"
    if user_key not in ctx.before:
        return True
    rows = _rows(ctx, user_key)
    if rows is None:
        return False
    before, after = rows
    expected = json.loads(json.dumps(before))
    for method_id, balance in _expected_balances(ctx, order).items():
        expected["payment_methods"][method_id]["balance"] = balance
    return bool(after == expected)


def order_is_cancelled(ctx: hx.Context) -> bool:
    """The order is 'cancelled' with the given reason."""
    rows = _rows(ctx, _order_key(ctx))
    return rows is not None and (rows[1]["status"], rows[1]["cancel_reason"]) == (
        "cancelled",
        ctx.args.reason,
    )


def payments_refunded(ctx: hx.Context) -> bool:
    """One refund per payment, same amount and method, was appended to the payment history."""
    rows = _rows(ctx, _order_key(ctx))
    if rows is None:
        return False
    before, after = rows
    history = before["payment_history"]
    refunds = [_payment("refund", p["amount"], p["payment_method_id"]) for p in history]
    return bool(after["payment_history"] == history + refunds)


def _expected_items(ctx: hx.Context, order: Record) -> list[Record]:
    """Upstream's item swap: each pair replaces the first item with the old id, and every
    replaced item takes the price and options of the *last* new item (upstream's loop variable),
    not of its own new item. Faithful to upstream, so the check holds on upstream's behaviour."""
    items: list[Record] = json.loads(json.dumps(order["items"]))
    if not ctx.args.item_ids:
        return items
    last = _variant(ctx, order, ctx.args.item_ids[-1], ctx.args.new_item_ids[-1])
    if last is None:
        raise LookupError("the last new item has no variant")
    for item_id, new_item_id in zip(ctx.args.item_ids, ctx.args.new_item_ids, strict=True):
        item = _find_item(items, item_id)
        if item is None:
            raise LookupError(f"item {item_id} is not in the order")
        item["item_id"] = new_item_id
        item["price"] = last["price"]
        item["options"] = dict(last["options"])
    return items


def items_swapped(ctx: hx.Context) -> bool:
    """The items were replaced by the new ones, as upstream replaces them."""
    rows = _rows(ctx, _order_key(ctx))
    return rows is not None and bool(rows[1]["items"] == _expected_items(ctx, rows[0]))


def order_marked_item_modified(ctx: hx.Context) -> bool:
    """The order is 'pending (item modified)'."""
    rows = _rows(ctx, _order_key(ctx))
    return rows is not None and rows[1]["status"] == "pending (item modified)"


def price_difference_settled(ctx: hx.Context) -> bool:
    """One payment (difference > 0) or refund of the exact difference was appended."""
    rows = _rows(ctx, _order_key(ctx))
    if rows is None:
        return False
    before, after = rows
    diff = _price_difference(ctx, before)
    kind = "payment" if diff > 0 else "refund"
    entry = _payment(kind, abs(diff), ctx.args.payment_method_id)
    return bool(after["payment_history"] == [*before["payment_history"], entry])


def payment_switched(ctx: hx.Context) -> bool:
    """A payment by the new method and a refund to the old one, of the total, were appended."""
    rows = _rows(ctx, _order_key(ctx))
    if rows is None:
        return False
    before, after = rows
    first = before["payment_history"][0]
    appended = [
        _payment("payment", first["amount"], ctx.args.payment_method_id),
        _payment("refund", first["amount"], first["payment_method_id"]),
    ]
    return bool(after["payment_history"] == before["payment_history"] + appended)


def order_address_set(ctx: hx.Context) -> bool:
    """The order ships to the given address."""
    rows = _rows(ctx, _order_key(ctx))
    return rows is not None and rows[1]["address"] == _address(ctx.args)


def user_address_set(ctx: hx.Context) -> bool:
    """The user's default address is the given one."""
    rows = _rows(ctx, f"users/{ctx.args.user_id}")
    return rows is not None and rows[1]["address"] == _address(ctx.args)


def exchange_requested(ctx: hx.Context) -> bool:
    """The order is 'exchange requested', with its items, method and price difference recorded.

    Items sorted and the difference rounded to cents, as upstream records them.
    """
    rows = _rows(ctx, _order_key(ctx))
    if rows is None:
        return False
    before, after = rows
    expected = {
        "status": "exchange requested",
        "exchange_items": sorted(ctx.args.item_ids),
        "exchange_new_items": sorted(ctx.args.new_item_ids),
        "exchange_payment_method_id": ctx.args.payment_method_id,
        "exchange_price_difference": round(_price_difference(ctx, before), 2),
    }
    return all(after[k] == v for k, v in expected.items())


def return_requested(ctx: hx.Context) -> bool:
    """The order is 'return requested' with the sorted items and the refund's method."""
    rows = _rows(ctx, _order_key(ctx))
    if rows is None:
        return False
    after = rows[1]
    expected = {
        "status": "return requested",
        "return_items": sorted(ctx.args.item_ids),
        "return_payment_method_id": ctx.args.payment_method_id,
    }
    return all(after[k] == v for k, v in expected.items())


_CHANGED_FIELDS: Final[Mapping[str, tuple[str, ...]]] = {
    "cancel_pending_order": ("status", "cancel_reason", "payment_history"),
    "exchange_delivered_order_items": (
        "status",
        "exchange_items",
        "exchange_new_items",
        "exchange_payment_method_id",
        "exchange_price_difference",
    ),
    "modify_pending_order_address": ("address",),
    "modify_pending_order_items": ("items", "status", "payment_history"),
    "modify_pending_order_payment": ("payment_history",),
    "modify_user_address": ("address",),
    "return_delivered_order_items": ("status", "return_items", "return_payment_method_id"),
}
"""The fields of its main row each write tool changes; every other field must stay as it was."""


def other_fields_unchanged(ctx: hx.Context) -> bool:
    """Nothing outside the fields the tool is meant to change differs in its main row."""
    key = f"users/{ctx.args.user_id}" if ctx.action == "modify_user_address" else _order_key(ctx)
    rows = _rows(ctx, key)
    return rows is not None and _only_changed(*rows, _CHANGED_FIELDS[ctx.action])


POSTCONDITIONS: Final[Mapping[str, tuple[Check, ...]]] = {
    "cancel_pending_order": (
        order_is_cancelled,
        payments_refunded,
        gift_card_balances_moved,
        other_fields_unchanged,
    ),
    "exchange_delivered_order_items": (exchange_requested, other_fields_unchanged),
    "modify_pending_order_address": (order_address_set, other_fields_unchanged),
    "modify_pending_order_items": (
        order_marked_item_modified,
        items_swapped,
        price_difference_settled,
        gift_card_balances_moved,
        other_fields_unchanged,
    ),
    "modify_pending_order_payment": (
        payment_switched,
        gift_card_balances_moved,
        other_fields_unchanged,
    ),
    "modify_user_address": (user_address_set, other_fields_unchanged),
    "return_delivered_order_items": (return_requested, other_fields_unchanged),
}
"""Each write tool's postconditions, checked against the rows after execution."""


# -- compensation ----------------------------------------------------------------------------


def restore_before(conn: sqlite3.Connection, ctx: hx.Context) -> None:
    """Write back, in one transaction, the before-row of every row the action changed
    (:meth:`harness.domains.records.Tables.restore_before`)."""
    DATABASE.restore_before(conn, ctx)


# -- idempotency -----------------------------------------------------------------------------


# Idempotency keys: OccurrenceKeys (harness.domains.base), the arguments' hash plus the
# occurrence number of that identical call. Why, for this domain:
#
# Why not the engine's default (a hash of name and arguments)? The engine answers a call whose
# key already committed with the recorded result, without running the tool. Upstream always
# runs it: a repeated cancel, item change, payment change, return or exchange fails its
# status check the second time (the agent must see that failure), and a repeated address
# change applies again, which matters after another change in between (address A, then B,
# then A again ends on A upstream; a deduplicated third call would leave B). None of the 74
# gold tasks repeats an identical write, so both keys replay gold faithfully; this one also
# stays faithful for agents that repeat themselves.
#
# The number counts identical calls within one :class:`hx.Episode` object, so a run that
# resumes a crashed episode and replays its calls from the start renumbers them the same way
# and every committed call is recognised (deduplicated), and a call left in doubt is matched
# to its intent. (An agent that resumes without replaying gets number 0 for its first call of
# any arguments, matching the first such call of the crashed session.)
#
# Keying is sound because every retail write is safe to run again after an unknown outcome:
# the status-changing tools refuse an order whose status they already changed, and the
# address tools write the same values again. So the actions are ``safe_to_repeat``.


# -- building ----------------------------------------------------------------------------------


def _recovered_record(tools: RetailTools, name: str) -> Callable[[hx.Context], Record]:
    """The record a write returns, read back when its answer was lost (as upstream returns it)."""

    def recovered(ctx: hx.Context) -> Record:
        if name == "modify_user_address":
            return tools.get_user_details(ctx.args.user_id)
        return tools.get_order_details(ctx.args.order_id)

    recovered.__name__ = f"{name}_from_state"
    return recovered


# build_actions(tools, state): each of the seven write tools as an action with upstream's name,
# arguments and docstring, its scope, preconditions, postconditions, compensation and key.
build_actions: Final = functools.partial(
    tau2.build_actions,
    names=WRITE_TOOLS,
    scope=_scope,
    preconditions=PRECONDITIONS,
    postconditions=POSTCONDITIONS,
    recovered=_recovered_record,
    database=DATABASE,
)

"""Generate ``tasks.json``, the project's own retail suite, from tau2-bench's ``db.json``.

The data ships in the package (``harness/domains/retail/data/db.json``, read as
:data:`harness.domains.retail.db.DEFAULT_DB_JSON`), so ``harness`` must be importable.

Run from anywhere: ``python tasks/retail/make_tasks.py`` (``--check`` only compares the file
with what it would write). Each task below is written by hand around real users, orders, items
and payment methods of ``db.json``; amounts the agent must tell the customer (refunds, price
differences, gift card balances) are computed from the data, never typed in, so the file cannot
drift from the database it runs on.

A task's ``reference_actions`` are what a correct agent calls, in order: the identification
lookup, the reads it needs, then the writes (after the customer confirms). A refusal task
lists only the reads made before refusing; the write the customer asks for, and that the tools
would reject, is kept in :data:`REFUSED` (the suite's test replays it and expects the tool's
error), since the task format has no field for it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from harness.domains.retail.db import DEFAULT_DB_JSON

HERE = Path(__file__).resolve().parent
DB: dict[str, dict[str, Any]] = json.loads(DEFAULT_DB_JSON.read_text(encoding="utf-8"))
USERS, ORDERS, PRODUCTS = DB["users"], DB["orders"], DB["products"]
WRITES = (
    "cancel_pending_order",
    "modify_pending_order_address",
    "modify_pending_order_items",
    "modify_pending_order_payment",
    "modify_user_address",
    "return_delivered_order_items",
    "exchange_delivered_order_items",
)

TASKS: list[dict[str, Any]] = []
REFUSED: dict[str, dict[str, Any]] = {}
"""Task id -> the write the customer asks for in a refusal task (the tools reject it)."""


# -- data helpers ----------------------------------------------------------------------------


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def full_name(uid: str) -> str:
    name = USERS[uid]["name"]
    return f"{name['first_name']} {name['last_name']}"


def ident(uid: str, how: str) -> tuple[str, dict[str, Any]]:
    """The sentence that tells the customer how they can be found, and the lookup it implies."""
    user = USERS[uid]
    if how == "email":
        return (
            f"You are {full_name(uid)}; the email on your account is {user['email']}.",
            call("find_user_id_by_email", email=user["email"]),
        )
    first, last = user["name"]["first_name"], user["name"]["last_name"]
    zip_code = user["address"]["zip"]
    return (
        f"You are {full_name(uid)} and you live in zip code {zip_code}; you do not remember "
        "which email address you used for the shop.",
        call("find_user_id_by_name_zip", first_name=first, last_name=last, zip=zip_code),
    )


def user_details(uid: str) -> dict[str, Any]:
    return call("get_user_details", user_id=uid)


def order_details(oid: str) -> dict[str, Any]:
    return call("get_order_details", order_id=oid)


def product_details(item_id: str) -> dict[str, Any]:
    return call("get_product_details", product_id=variant(item_id)[0])


def item(oid: str, item_id: str) -> dict[str, Any]:
    found = [i for i in ORDERS[oid]["items"] if i["item_id"] == item_id]
    assert found, f"{item_id} not in {oid}"
    return dict(found[0])


def variant(item_id: str) -> tuple[str, dict[str, Any]]:
    """(product id, variant) of an item id."""
    for pid, product in PRODUCTS.items():
        if item_id in product["variants"]:
            return pid, dict(product["variants"][item_id])
    raise KeyError(item_id)


def options(item_id: str) -> str:
    return ", ".join(f"{k} {v}" for k, v in variant(item_id)[1]["options"].items())


def thing(oid: str, item_id: str) -> str:
    """'the Desk Lamp (color white, brightness high, power source battery)'."""
    return f"the {item(oid, item_id)['name']} ({options(item_id)})"


def price(item_id: str) -> float:
    return float(variant(item_id)[1]["price"])


def paid(oid: str) -> float:
    return float(ORDERS[oid]["payment_history"][0]["amount"])


def balance(uid: str, method: str) -> float:
    return float(USERS[uid]["payment_methods"][method]["balance"])


def money(amount: float) -> str:
    """How an amount must appear in the agent's words: 2 decimals, trailing zeros dropped (a
    substring of both '37.6' and '37.60'). Amounts of 1,000 or more are never required: an
    agent may write a thousands separator."""
    amount = round(abs(amount), 2)
    assert amount < 1000, f"{amount}: a thousands separator would break the substring match"
    text = f"{amount:.2f}".rstrip("0").rstrip(".")
    return text


def difference(oid: str, pairs: list[tuple[str, str]]) -> float:
    return round(sum(price(new) - item(oid, old)["price"] for old, new in pairs), 2)


def address(address1: str, address2: str, city: str, state: str, zip_code: str) -> dict[str, str]:
    return {
        "address1": address1,
        "address2": address2,
        "city": city,
        "state": state,
        "country": "USA",
        "zip": zip_code,
    }


def spoken(addr: dict[str, str]) -> str:
    line2 = f", {addr['address2']}" if addr["address2"] else ""
    return f"{addr['address1']}{line2}, {addr['city']}, {addr['state']} {addr['zip']}, USA"


def check(key: str, path: list[str], equals: Any) -> dict[str, Any]:
    return {"key": key, "path": path, "equals": equals}


def status_is(oid: str, status: str) -> dict[str, Any]:
    return check(f"orders/{oid}", ["status"], status)


def balance_is(uid: str, method: str, amount: float) -> dict[str, Any]:
    return check(f"users/{uid}", ["payment_methods", method, "balance"], round(amount, 2))


# -- the task record -------------------------------------------------------------------------


def difficulty(actions: list[dict[str, Any]]) -> str:
    """easy: at most one write in at most 3 steps; hard: 3+ writes or 8+ steps; else medium."""
    writes = sum(a["name"] in WRITES for a in actions)
    if writes <= 1 and len(actions) <= 3:
        return "easy"
    if writes >= 3 or len(actions) >= 8:
        return "hard"
    return "medium"


def task(
    instruction: str,
    actions: list[dict[str, Any]],
    *,
    expect: str = "complete",
    outputs: tuple[str, ...] = (),
    checks: tuple[dict[str, Any], ...] = (),
    tags: tuple[str, ...] = (),
    refused: dict[str, Any] | None = None,
) -> None:
    task_id = f"retail-{len(TASKS) + 1:03d}"
    writes = [a for a in actions if a["name"] in WRITES]
    orders = {a["arguments"]["order_id"] for a in writes if "order_id" in a["arguments"]}
    auto = sorted({a["name"] for a in writes})
    if any(a["name"] == "transfer_to_human_agents" for a in actions):
        auto.append("transfer_to_human_agents")
    if refused is not None:
        assert expect == "refuse" and not writes, task_id
        REFUSED[task_id] = refused
        auto.append(f"refuses:{refused['name']}")
    if len(orders) > 1:
        auto.append("multi-order")
    record: dict[str, Any] = {
        "id": task_id,
        "version": "1",
        "instruction": " ".join(instruction.split()),
        "reference_actions": actions,
        "expect": expect,
    }
    if outputs:
        record["required_outputs"] = list(outputs)
    if checks:
        record["checks"] = list(checks)
    record["tags"] = [
        *auto,
        *tags,
        actions[0]["name"].removeprefix("find_user_id_by_"),
        difficulty(actions),
    ]
    TASKS.append(record)


# -- cancellations ---------------------------------------------------------------------------


def cancellations() -> None:
    uid, oid = "yusuf_hernandez_6467", "#W2033238"
    who, find = ident(uid, "email")
    task(
        f"""{who} Your order {oid} holds {thing(oid, "9045948550")}. A friend gave you the
        same pair, so you no longer need them. Ask to cancel that order, confirm when asked,
        and ask how much you get back and to which payment method.""",
        [
            find,
            order_details(oid),
            call("cancel_pending_order", order_id=oid, reason="no longer needed"),
        ],
        outputs=(money(paid(oid)),),
        checks=(
            status_is(oid, "cancelled"),
            check(f"orders/{oid}", ["cancel_reason"], "no longer needed"),
        ),
    )

    uid, oid, card = "omar_muller_7891", "#W7044833", "gift_card_3689412"
    who, find = ident(uid, "zip")
    task(
        f"""{who} You ordered a jigsaw puzzle and a notebook by mistake (you meant to put
        them on a wish list); you do not know the order number. Have that order cancelled
        because it was ordered by mistake. You paid with a gift card: ask how much goes back
        to it and what the card's balance will be afterwards.""",
        [
            find,
            user_details(uid),
            order_details(oid),
            call("cancel_pending_order", order_id=oid, reason="ordered by mistake"),
        ],
        outputs=(money(paid(oid)), money(balance(uid, card) + paid(oid))),
        checks=(status_is(oid, "cancelled"), balance_is(uid, card, balance(uid, card) + paid(oid))),
        tags=("gift-card",),
    )

    uid, first, second = "lei_ahmed_1705", "#W9132840", "#W6724985"
    who, find = ident(uid, "email")
    task(
        f"""{who} You are moving abroad next week and no longer need two of your pending
        orders: the one with a skateboard and two cycling helmets, and the one with a bookshelf
        and a water bottle. Cancel both (reason: no longer needed); your other pending orders
        stay as they are. Ask for the refund of each cancelled order.""",
        [
            find,
            user_details(uid),
            order_details(first),
            order_details(second),
            call("cancel_pending_order", order_id=first, reason="no longer needed"),
            call("cancel_pending_order", order_id=second, reason="no longer needed"),
        ],
        outputs=(money(paid(first)), money(paid(second))),
        checks=(
            status_is(first, "cancelled"),
            status_is(second, "cancelled"),
            status_is("#W9015076", "pending"),
            status_is("#W3931703", "pending"),
        ),
    )

    uid, delivered, pending = "sofia_kovacs_7075", "#W7736983", "#W5765741"
    who, find = ident(uid, "zip")
    task(
        f"""{who} First you want the tracking number of the coffee maker you received
        recently. Then cancel the order with the electric toothbrush and the portable charger:
        you ordered it by mistake. Ask how much will be refunded.""",
        [
            find,
            user_details(uid),
            order_details(delivered),
            order_details(pending),
            call("cancel_pending_order", order_id=pending, reason="ordered by mistake"),
        ],
        outputs=(ORDERS[delivered]["fulfillments"][0]["tracking_id"][0], money(paid(pending))),
        checks=(status_is(pending, "cancelled"), status_is("#W9869592", "pending")),
        tags=("information",),
    )

    uid, oid, card = "chen_brown_8075", "#W4296426", "gift_card_7497429"
    who, find = ident(uid, "email")
    task(
        f"""{who} You have two orders waiting to ship. You no longer need the water bottle;
        cancel that order but keep the wireless earbuds. The order was paid with your gift
        card: ask for the card's balance once the refund is in.""",
        [
            find,
            user_details(uid),
            order_details(oid),
            call("cancel_pending_order", order_id=oid, reason="no longer needed"),
        ],
        outputs=(money(balance(uid, card) + paid(oid)),),
        checks=(
            status_is(oid, "cancelled"),
            status_is("#W3381155", "pending"),
            balance_is(uid, card, balance(uid, card) + paid(oid)),
        ),
        tags=("gift-card",),
    )


# -- shipping addresses of pending orders ----------------------------------------------------


def order_addresses() -> None:
    uid, oid = "evelyn_hernandez_1701", "#W4895606"
    new = address("1021 Elm Court", "Apt 4B", "Pasadena", "CA", "91101")
    who, find = ident(uid, "email")
    task(
        f"""{who} Your order {oid} (an e-reader, a makeup kit and a desk lamp) should go to
        your sister instead of you: {spoken(new)}. Ask for the shipping address of that order
        to be changed; nothing else changes.""",
        [find, order_details(oid), call("modify_pending_order_address", order_id=oid, **new)],
        checks=(check(f"orders/{oid}", ["address"], new),),
    )

    uid, oid = "olivia_jackson_1219", "#W6975922"
    home = dict(USERS[uid]["address"])
    who, find = ident(uid, "zip")
    task(
        f"""{who} The order with the smart thermostat, the wireless earbuds, a jigsaw puzzle
        and a mechanical keyboard is set to ship to an office in San Francisco you no longer
        work at. Ask for it to be sent to your home address, the default address on your
        account, instead.""",
        [
            find,
            user_details(uid),
            order_details(oid),
            call("modify_pending_order_address", order_id=oid, **home),
        ],
        checks=(check(f"orders/{oid}", ["address"], home),),
    )

    uid, oid = "isabella_santos_1643", "#W9667707"
    new = address("77 Harbor View Road", "", "Stamford", "CT", "06902")
    pairs = [("9635758562", "4107812777")]
    who, find = ident(uid, "email")
    task(
        f"""{who} Two changes to your order with the makeup kit, the e-reader and the
        running shoes: ship it to your new place, {spoken(new)}, and swap the running shoes
        ({options("9635758562")}) for the same size in {options("4107812777")}. Pay any
        difference with your credit card, and ask what the difference is. That is all you
        want to change in that order.""",
        [
            find,
            order_details(oid),
            product_details("4107812777"),
            call("modify_pending_order_address", order_id=oid, **new),
            call(
                "modify_pending_order_items",
                order_id=oid,
                item_ids=[p[0] for p in pairs],
                new_item_ids=[p[1] for p in pairs],
                payment_method_id="credit_card_4056740",
            ),
        ],
        outputs=(money(difference(oid, pairs)),),
        checks=(
            status_is(oid, "pending (item modified)"),
            check(f"orders/{oid}", ["address", "zip"], "06902"),
        ),
    )


# -- items of pending orders -----------------------------------------------------------------


def item_changes() -> None:
    uid, oid = "raj_sanchez_2970", "#W4566809"
    pairs = [("5826601160", "3076708684")]
    who, find = ident(uid, "email")
    task(
        f"""{who} In your pending order with the air purifier and the indoor security
        camera, you want a different air purifier: same medium room size, but with a HEPA
        filter and quiet operation instead of {options("5826601160")}. Pay the difference
        with your Mastercard credit card and ask how much it is.""",
        [
            find,
            order_details(oid),
            product_details("3076708684"),
            call(
                "modify_pending_order_items",
                order_id=oid,
                item_ids=["5826601160"],
                new_item_ids=["3076708684"],
                payment_method_id="credit_card_3362387",
            ),
        ],
        outputs=(money(difference(oid, pairs)),),
        checks=(status_is(oid, "pending (item modified)"),),
    )

    uid, oid = "lei_ahmed_1705", "#W9132840"
    pairs = [("8573379326", "1719127154"), ("6048672633", "1665571435")]
    who, find = ident(uid, "zip")
    task(
        f"""{who} Your pending order {oid} has two cycling helmets. Keep both sizes but
        change the ventilation: the size M red one should have medium ventilation, and the
        size L black one high ventilation. Both changes at once; any difference goes to or
        comes from your credit card. Ask how much money moves and in which direction.""",
        [
            find,
            order_details(oid),
            product_details("1719127154"),
            call(
                "modify_pending_order_items",
                order_id=oid,
                item_ids=[p[0] for p in pairs],
                new_item_ids=[p[1] for p in pairs],
                payment_method_id="credit_card_3593714",
            ),
        ],
        outputs=(money(difference(oid, pairs)),),
        checks=(status_is(oid, "pending (item modified)"),),
        tags=("refund",),
    )

    uid, oid, card = "anya_garcia_3271", "#W6436609", "gift_card_4374071"
    pairs = [("1709726483", "7902309762")]
    who, find = ident(uid, "zip")
    diff = difference(oid, pairs)
    task(
        f"""{who} In your pending order with a laptop, a smart watch, a tea kettle and a
        makeup kit, you would like the makeup kit in {options("7902309762")} instead of
        {options("1709726483")}. Pay the difference with your gift card. Ask how much is
        charged and what remains on the gift card.""",
        [
            find,
            user_details(uid),
            order_details(oid),
            product_details("7902309762"),
            call(
                "modify_pending_order_items",
                order_id=oid,
                item_ids=["1709726483"],
                new_item_ids=["7902309762"],
                payment_method_id=card,
            ),
        ],
        outputs=(money(diff), money(balance(uid, card) - diff)),
        checks=(
            status_is(oid, "pending (item modified)"),
            balance_is(uid, card, balance(uid, card) - diff),
        ),
        tags=("gift-card",),
    )

    uid, oid = "emma_brown_8847", "#W6460787"
    pairs = [("3098764622", "6843647669")]
    who, find = ident(uid, "email")
    task(
        f"""{who} The skateboard you ordered has not shipped yet. You would rather have the
        {options("6843647669")} version than {options("3098764622")}. The refund of the
        difference goes to the PayPal account you paid with; ask how much it is.""",
        [
            find,
            order_details(oid),
            product_details("6843647669"),
            call(
                "modify_pending_order_items",
                order_id=oid,
                item_ids=["3098764622"],
                new_item_ids=["6843647669"],
                payment_method_id="paypal_9039769",
            ),
        ],
        outputs=(money(difference(oid, pairs)),),
        checks=(status_is(oid, "pending (item modified)"),),
        tags=("refund",),
    )

    uid, oid, card = "omar_kim_3528", "#W8557584", "gift_card_3749819"
    pairs = [("9747045638", "3909406921"), ("1096508426", "4068787148")]
    diff = difference(oid, pairs)
    who, find = ident(uid, "email")
    task(
        f"""{who} In your pending order with the jigsaw puzzle, the cycling helmet, two tea
        kettles and the backpack you want two changes, made together: the glass 1 liter tea
        kettle for electric stoves should become the one for gas stoves (still glass, 1
        liter), and the beginner 500-piece art puzzle should become the intermediate one.
        Pay with your gift card. Ask for the total charged and the gift card's balance
        afterwards.""",
        [
            find,
            user_details(uid),
            order_details(oid),
            product_details("3909406921"),
            product_details("4068787148"),
            call(
                "modify_pending_order_items",
                order_id=oid,
                item_ids=[p[0] for p in pairs],
                new_item_ids=[p[1] for p in pairs],
                payment_method_id=card,
            ),
        ],
        outputs=(money(diff), money(balance(uid, card) - diff)),
        checks=(
            status_is(oid, "pending (item modified)"),
            balance_is(uid, card, balance(uid, card) - diff),
        ),
        tags=("gift-card",),
    )


# -- payment methods of pending orders -------------------------------------------------------


def payment_changes() -> None:
    uid, oid, card = "omar_kim_3528", "#W1080318", "gift_card_3749819"
    who, find = ident(uid, "zip")
    task(
        f"""{who} Your pending order with a single T-shirt was charged to your Mastercard.
        You would rather pay for it with your gift card. Ask for the switch and for the gift
        card balance left afterwards.""",
        [
            find,
            user_details(uid),
            order_details(oid),
            call("modify_pending_order_payment", order_id=oid, payment_method_id=card),
        ],
        outputs=(money(balance(uid, card) - paid(oid)),),
        checks=(balance_is(uid, card, balance(uid, card) - paid(oid)), status_is(oid, "pending")),
        tags=("gift-card",),
    )

    uid, oid, card = "evelyn_ahmed_3960", "#W3746173", "gift_card_5683713"
    who, find = ident(uid, "email")
    task(
        f"""{who} You paid for your pending makeup kit order with a gift card and want to
        keep that card for a present. Move the payment of that order to your Mastercard. Ask
        when the gift card gets its money back and what its balance will be.""",
        [
            find,
            user_details(uid),
            order_details(oid),
            call(
                "modify_pending_order_payment",
                order_id=oid,
                payment_method_id="credit_card_7898168",
            ),
        ],
        outputs=(money(balance(uid, card) + paid(oid)),),
        checks=(balance_is(uid, card, balance(uid, card) + paid(oid)),),
        tags=("gift-card",),
    )

    uid, oid = "raj_li_9474", "#W8967935"
    who, find = ident(uid, "zip")
    task(
        f"""{who} Your Visa card was flagged by your bank, so you want your pending order
        with the grill, two bookshelves and a water bottle paid with your PayPal account
        instead. Nothing else changes.""",
        [
            find,
            user_details(uid),
            order_details(oid),
            call("modify_pending_order_payment", order_id=oid, payment_method_id="paypal_2028062"),
        ],
        checks=(status_is(oid, "pending"),),
    )

    uid, oid = "ava_kovacs_3448", "#W4184032"
    new = address("1450 Desert Bloom Way", "Unit 9", "Tempe", "AZ", "85281")
    who, find = ident(uid, "email")
    task(
        f"""{who} For your pending order with the skateboard, the headphones, the garden hose
        and the tea kettle: pay with your PayPal account instead of the Mastercard, and ship
        it to {spoken(new)}. Your account's default address stays the same.""",
        [
            find,
            user_details(uid),
            order_details(oid),
            call("modify_pending_order_address", order_id=oid, **new),
            call("modify_pending_order_payment", order_id=oid, payment_method_id="paypal_7443913"),
        ],
        checks=(
            check(f"orders/{oid}", ["address"], new),
            check(f"users/{uid}", ["address", "zip"], "85052"),
        ),
    )


# -- default addresses -----------------------------------------------------------------------


def user_addresses() -> None:
    uid = "noah_li_2316"
    new = address("88 Orchard Street", "Apt 12", "Boston", "MA", "02118")
    who, find = ident(uid, "zip")
    task(
        f"""{who} You have moved. Update the default address on your account to
        {spoken(new)}. You have no open orders to change.""",
        [find, call("modify_user_address", user_id=uid, **new)],
        checks=(check(f"users/{uid}", ["address"], new),),
    )

    uid = "ivan_santos_6635"
    new = address("3120 Bluebonnet Trail", "", "Round Rock", "TX", "78664")
    pending = ["#W8770097", "#W5183325", "#W3913498"]
    who, find = ident(uid, "email")
    task(
        f"""{who} You moved to {spoken(new)}. Make it your default address, and have every
        order of yours that has not shipped yet delivered there too (you think there are
        three of them).""",
        [
            find,
            user_details(uid),
            *(order_details(o) for o in pending),
            call("modify_user_address", user_id=uid, **new),
            *(call("modify_pending_order_address", order_id=o, **new) for o in pending),
        ],
        checks=(
            check(f"users/{uid}", ["address"], new),
            *(check(f"orders/{o}", ["address"], new) for o in pending),
            check("orders/#W6893533", ["address"], ORDERS["#W6893533"]["address"]),
        ),
    )

    uid, card = "mia_moore_8366", "gift_card_7471275"
    new = address("415 Valencia Street", "Floor 2", "San Francisco", "CA", "94103")
    who, find = ident(uid, "email")
    task(
        f"""{who} Change the default address on your account to {spoken(new)}. Your pending
        order keeps its current shipping address. Also ask how much is left on your gift
        card.""",
        [find, user_details(uid), call("modify_user_address", user_id=uid, **new)],
        outputs=(money(balance(uid, card)),),
        checks=(check(f"users/{uid}", ["address"], new),),
        tags=("information",),
    )


# -- returns ---------------------------------------------------------------------------------


def returns() -> None:
    uid, oid = "noah_li_2316", "#W8553554"
    who, find = ident(uid, "email")
    task(
        f"""{who} Your dog will not sleep in the pet bed you received ({options("4537595158")}).
        Return it, with the refund to the Visa card you paid with, and ask how much you will
        get back.""",
        [
            find,
            order_details(oid),
            call(
                "return_delivered_order_items",
                order_id=oid,
                item_ids=["4537595158"],
                payment_method_id="credit_card_4467209",
            ),
        ],
        outputs=(money(price("4537595158")),),
        checks=(status_is(oid, "return requested"),),
    )

    uid, oid, card = "isabella_johnson_6293", "#W3431083", "gift_card_7172261"
    who, find = ident(uid, "zip")
    task(
        f"""{who} Return everything in your delivered order with the backpack and the
        wireless earbuds. You paid with PayPal but want the refund on your gift card. Ask for
        the total refund.""",
        [
            find,
            user_details(uid),
            order_details(oid),
            call(
                "return_delivered_order_items",
                order_id=oid,
                item_ids=["6309044598", "3694871183"],
                payment_method_id=card,
            ),
        ],
        outputs=(money(paid(oid)),),
        checks=(
            status_is(oid, "return requested"),
            check(f"orders/{oid}", ["return_payment_method_id"], card),
        ),
        tags=("gift-card",),
    )

    uid, oid = "yusuf_hernandez_6467", "#W7133840"
    back = ["7127170374", "4947717507"]
    who, find = ident(uid, "zip")
    task(
        f"""{who} From your delivered order with a bookshelf, a jigsaw puzzle and a backpack,
        keep the bookshelf but return the puzzle and the backpack. The refund goes to your
        PayPal account. Ask how much it comes to.""",
        [
            find,
            user_details(uid),
            order_details(oid),
            call(
                "return_delivered_order_items",
                order_id=oid,
                item_ids=back,
                payment_method_id="paypal_9426036",
            ),
        ],
        outputs=(money(sum(price(i) for i in back)),),
        checks=(
            status_is(oid, "return requested"),
            check(f"orders/{oid}", ["return_items"], sorted(back)),
        ),
    )

    uid, big, single = "sophia_garcia_5025", "#W5777276", "#W9336725"
    who, find = ident(uid, "email")
    task(
        f"""{who} You ended up with two identical wooden brown bookshelves: one came alone,
        the other with a tablet and a notebook. Return the bookshelf that came alone, and
        from the other order return only the notebook. Refunds go to your credit card; ask
        for the amount of each return.""",
        [
            find,
            user_details(uid),
            order_details(big),
            order_details(single),
            call(
                "return_delivered_order_items",
                order_id=single,
                item_ids=["7154215719"],
                payment_method_id="credit_card_4147840",
            ),
            call(
                "return_delivered_order_items",
                order_id=big,
                item_ids=["7579176349"],
                payment_method_id="credit_card_4147840",
            ),
        ],
        outputs=(money(price("7154215719")), money(price("7579176349"))),
        checks=(
            status_is(single, "return requested"),
            status_is(big, "return requested"),
            check(f"orders/{big}", ["return_items"], ["7579176349"]),
        ),
    )


# -- exchanges -------------------------------------------------------------------------------


def exchanges() -> None:
    uid, oid = "olivia_brown_4616", "#W2912153"
    pairs = [("1270145486", "9083642334")]
    who, find = ident(uid, "email")
    task(
        f"""{who} The desk lamp you received runs on batteries and you keep forgetting to
        charge them. Exchange it for the same white, high-brightness lamp powered over USB;
        the kettle from that order stays. Pay any difference with your Visa card and ask how
        much it is.""",
        [
            find,
            order_details(oid),
            product_details("9083642334"),
            call(
                "exchange_delivered_order_items",
                order_id=oid,
                item_ids=["1270145486"],
                new_item_ids=["9083642334"],
                payment_method_id="credit_card_3081930",
            ),
        ],
        outputs=(money(difference(oid, pairs)),),
        checks=(
            status_is(oid, "exchange requested"),
            check(f"orders/{oid}", ["exchange_price_difference"], difference(oid, pairs)),
        ),
    )

    uid, oid, card = "mia_moore_8366", "#W5544629", "gift_card_7471275"
    pairs = [("6735339143", "8895454203"), ("1583904702", "8798690242")]
    who, find = ident(uid, "zip")
    task(
        f"""{who} From your delivered order with a bookshelf and an electric toothbrush,
        exchange both: the bookshelf for the {options("8895454203")} one, and the toothbrush
        for the {options("8798690242")} one. Pay the price difference with your gift card
        and ask what it is.""",
        [
            find,
            user_details(uid),
            order_details(oid),
            product_details("8895454203"),
            product_details("8798690242"),
            call(
                "exchange_delivered_order_items",
                order_id=oid,
                item_ids=[p[0] for p in pairs],
                new_item_ids=[p[1] for p in pairs],
                payment_method_id=card,
            ),
        ],
        outputs=(money(difference(oid, pairs)),),
        checks=(
            status_is(oid, "exchange requested"),
            check(f"orders/{oid}", ["exchange_payment_method_id"], card),
        ),
        tags=("gift-card",),
    )

    uid, oid = "yusuf_hernandez_6467", "#W1633718"
    pairs = [("5952720925", "1349017811")]
    who, find = ident(uid, "email")
    task(
        f"""{who} The espresso coffee maker you received is not what you drink. Exchange it
        for the {options("1349017811")} model; keep the vacuum cleaner. Any refund goes to
        your PayPal account; ask how much you get back.""",
        [
            find,
            user_details(uid),
            order_details(oid),
            product_details("1349017811"),
            call(
                "exchange_delivered_order_items",
                order_id=oid,
                item_ids=["5952720925"],
                new_item_ids=["1349017811"],
                payment_method_id="paypal_9426036",
            ),
        ],
        outputs=(money(difference(oid, pairs)),),
        checks=(status_is(oid, "exchange requested"),),
        tags=("refund",),
    )

    uid, first, second = "harper_silva_8534", "#W3323013", "#W1578930"
    pairs = [("9829827210", "3369928769")]
    who, find = ident(uid, "email")
    task(
        f"""{who} Two delivered orders need attention. In the one with the patio umbrella,
        exchange the blue 25ft vinyl garden hose for the green one of the same length and
        material. In the one with the makeup kits, return the LED light bulb. Everything is
        settled on your Visa card. Ask what the exchange costs and what the return refunds.""",
        [
            find,
            user_details(uid),
            order_details(first),
            order_details(second),
            product_details("3369928769"),
            call(
                "exchange_delivered_order_items",
                order_id=first,
                item_ids=["9829827210"],
                new_item_ids=["3369928769"],
                payment_method_id="credit_card_7453883",
            ),
            call(
                "return_delivered_order_items",
                order_id=second,
                item_ids=["3034017579"],
                payment_method_id="credit_card_7453883",
            ),
        ],
        outputs=(money(difference(first, pairs)), money(price("3034017579"))),
        checks=(status_is(first, "exchange requested"), status_is(second, "return requested")),
    )


# -- several requests, several orders --------------------------------------------------------


def combined() -> None:
    uid = "lei_li_6575"
    laptop, camera, delivered = "#W5166363", "#W3414433", "#W6289770"
    card, visa = "gift_card_8049813", "credit_card_4466831"
    who, find = ident(uid, "email")
    task(
        f"""{who} Three things. Cancel the order with just the laptop: you no longer need
        it. The order with the digital camera, the kettle and the wall clock was paid with
        your gift card; put it on your Visa card instead. And return the sunglasses from your
        delivered order with the grill, refunded to the Visa card it was paid with. Ask how
        much the sunglasses refund is.""",
        [
            find,
            user_details(uid),
            order_details(laptop),
            order_details(camera),
            order_details(delivered),
            call("cancel_pending_order", order_id=laptop, reason="no longer needed"),
            call("modify_pending_order_payment", order_id=camera, payment_method_id=visa),
            call(
                "return_delivered_order_items",
                order_id=delivered,
                item_ids=["4548300368"],
                payment_method_id=visa,
            ),
        ],
        outputs=(money(price("4548300368")),),
        checks=(
            status_is(laptop, "cancelled"),
            status_is(delivered, "return requested"),
            balance_is(uid, card, balance(uid, card) + paid(camera)),
        ),
        tags=("gift-card",),
    )

    uid, card = "omar_muller_7891", "gift_card_3689412"
    puzzle, clothes, shelf = "#W7044833", "#W8642391", "#W9474165"
    pairs = [("5992316252", "8590708195"), ("7228247242", "8106223139")]
    refund = paid(puzzle)
    diff = difference(clothes, pairs)
    new = address("19 Lakeshore Terrace", "Apt 3C", "Evanston", "IL", "60201")
    who, find = ident(uid, "zip")
    task(
        f"""{who} Everything you have on order was paid with your gift card. Cancel the
        small order with the puzzle and the notebook (ordered by mistake). In the order with
        the fleece jacket and the hiking boots, change the jacket to size XL in navy (half
        zipper) and the boots to size 9 (leather, waterproof), paid from the gift card after
        the refund. Ship the order with the tablet to {spoken(new)}. Ask for the gift card's
        balance after the refund, and again after the item change.""",
        [
            find,
            user_details(uid),
            order_details(puzzle),
            order_details(clothes),
            order_details(shelf),
            call("cancel_pending_order", order_id=puzzle, reason="ordered by mistake"),
            call(
                "modify_pending_order_items",
                order_id=clothes,
                item_ids=[p[0] for p in pairs],
                new_item_ids=[p[1] for p in pairs],
                payment_method_id=card,
            ),
            call("modify_pending_order_address", order_id=shelf, **new),
        ],
        outputs=(money(balance(uid, card) + refund), money(balance(uid, card) + refund - diff)),
        checks=(
            status_is(puzzle, "cancelled"),
            status_is(clothes, "pending (item modified)"),
            check(f"orders/{shelf}", ["address"], new),
            balance_is(uid, card, balance(uid, card) + refund - diff),
        ),
        tags=("gift-card",),
    )

    uid, card = "ethan_lopez_6291", "gift_card_7219486"
    delivered, shirt, chair, phone = "#W8632528", "#W8073920", "#W9409203", "#W6426438"
    new = address("640 Riverside Avenue", "Apt 21", "Cincinnati", "OH", "45202")
    boots = [("2185126308", "8106223139")]
    tee = [("3234800602", "9354168549")]
    who, find = ident(uid, "email")
    task(
        f"""{who} You are moving to {spoken(new)} and want your account sorted out in one
        call. Make that your default address, and send the pending orders with the office
        chair and with the smartphone and wristwatch there. In the pending order with the
        T-shirt, change the T-shirt to red, size XXL, crew neck. Exchange the hiking boots you
        received for size 9 leather waterproof ones. Use your gift card for any price
        difference, and ask what each change costs.""",
        [
            find,
            user_details(uid),
            order_details(chair),
            order_details(phone),
            order_details(shirt),
            order_details(delivered),
            call("modify_user_address", user_id=uid, **new),
            call("modify_pending_order_address", order_id=chair, **new),
            call("modify_pending_order_address", order_id=phone, **new),
            call(
                "modify_pending_order_items",
                order_id=shirt,
                item_ids=["3234800602"],
                new_item_ids=["9354168549"],
                payment_method_id=card,
            ),
            call(
                "exchange_delivered_order_items",
                order_id=delivered,
                item_ids=["2185126308"],
                new_item_ids=["8106223139"],
                payment_method_id=card,
            ),
        ],
        outputs=(money(difference(shirt, tee)), money(difference(delivered, boots))),
        checks=(
            check(f"users/{uid}", ["address"], new),
            check(f"orders/{chair}", ["address"], new),
            check(f"orders/{phone}", ["address"], new),
            status_is(shirt, "pending (item modified)"),
            status_is(delivered, "exchange requested"),
        ),
        tags=("gift-card",),
    )


# -- refusals --------------------------------------------------------------------------------


def refusals() -> None:
    uid, oid = "olivia_brown_4616", "#W8033354"
    who, find = ident(uid, "zip")
    task(
        f"""{who} You want to cancel your order {oid} with the air purifier, two cycling
        helmets and the smart watch, because you no longer need it. It has already been
        delivered; you want a cancellation, not a return, and you do not accept anything
        else.""",
        [find, order_details(oid)],
        expect="refuse",
        refused=call("cancel_pending_order", order_id=oid, reason="no longer needed"),
    )

    uid, oid = "ava_johnson_5052", "#W2317937"
    who, find = ident(uid, "email")
    task(
        f"""{who} Cancel your order with the hiking boots, the luggage set, the patio
        umbrella and the pet bed ({oid}): you ordered it by mistake. If the agent says it is
        too late, ask again once, then accept and end the conversation.""",
        [find, order_details(oid)],
        expect="refuse",
        refused=call("cancel_pending_order", order_id=oid, reason="ordered by mistake"),
    )

    uid, oid = "raj_smith_7423", "#W8704143"
    who, find = ident(uid, "zip")
    task(
        f"""{who} Cancel your pending electric kettle order: you found the same kettle
        cheaper at another store. That is the only reason, and you will not give a different
        one even if asked.""",
        [find, user_details(uid), order_details(oid)],
        expect="refuse",
        refused=call(
            "cancel_pending_order", order_id=oid, reason="found it cheaper at another store"
        ),
    )

    uid, oid = "isabella_santos_1643", "#W9527030"
    who, find = ident(uid, "email")
    task(
        f"""{who} Your order {oid} with a smart watch and hiking boots has not shipped yet,
        but you want to exchange the watch for the silver one with a leather band and LCD
        display right now, as an exchange. You do not want the order itself modified, and
        nothing else.""",
        [find, order_details(oid)],
        expect="refuse",
        refused=call(
            "exchange_delivered_order_items",
            order_id=oid,
            item_ids=["9408160950"],
            new_item_ids=["9811090008"],
            payment_method_id="credit_card_4056740",
        ),
    )

    uid, oid = "daiki_li_8218", "#W6958840"
    who, find = ident(uid, "email")
    task(
        f"""{who} You want to pay for your pending order with the tablet, the office chair
        and the two cycling helmets with your gift card instead of your Visa card. You will
        not split the payment or use anything other than the gift card.""",
        [find, user_details(uid), order_details(oid)],
        expect="refuse",
        refused=call(
            "modify_pending_order_payment", order_id=oid, payment_method_id="gift_card_5730441"
        ),
    )

    uid, oid = "amelia_kim_4338", "#W7634667"
    who, find = ident(uid, "zip")
    task(
        f"""{who} In your pending order, change the black desk lamp to the white one with
        high brightness powered over USB, and pay the difference with your gift card only:
        you will not use PayPal for it.""",
        [find, user_details(uid), order_details(oid), product_details("9083642334")],
        expect="refuse",
        refused=call(
            "modify_pending_order_items",
            order_id=oid,
            item_ids=["5320792178"],
            new_item_ids=["9083642334"],
            payment_method_id="gift_card_4019778",
        ),
    )

    uid, oid = "yara_lee_7701", "#W1341845"
    who, find = ident(uid, "email")
    task(
        f"""{who} Return the Bluetooth speaker from your delivered order {oid}. You paid
        with your Visa card, which you are closing, so you want the refund on your
        Mastercard ending in 5715 and on no other method.""",
        [find, user_details(uid), order_details(oid)],
        expect="refuse",
        refused=call(
            "return_delivered_order_items",
            order_id=oid,
            item_ids=["6704763132"],
            payment_method_id="credit_card_6680679",
        ),
    )

    uid, oid = "olivia_smith_5265", "#W5202795"
    who, find = ident(uid, "zip")
    task(
        f"""{who} You never use the gaming mouse from your delivered order with the action
        camera and the office chair. Exchange it for a mechanical keyboard (clicky switches,
        white backlight, full size). You want that keyboard in exchange, not a return.""",
        [find, user_details(uid), order_details(oid)],
        expect="refuse",
        refused=call(
            "exchange_delivered_order_items",
            order_id=oid,
            item_ids=["2880340443"],
            new_item_ids=["6342039236"],
            payment_method_id="credit_card_7971769",
        ),
    )

    uid, oid = "mohamed_li_1979", "#W7824724"
    new = address("52 Scioto Mile", "", "Columbus", "OH", "43215")
    who, find = ident(uid, "email")
    task(
        f"""{who} Your order with the headphones, the tablet, the skateboard, the garden hose
        and the thermostat should go to your office, {spoken(new)}. It is already being
        processed; you still want the address of that order changed and nothing else.""",
        [find, user_details(uid), order_details(oid)],
        expect="refuse",
        refused=call("modify_pending_order_address", order_id=oid, **new),
    )

    uid, oid = "yara_li_8961", "#W3400144"
    who, find = ident(uid, "zip")
    task(
        f"""{who} Return the notebook from your order with the laptop ({oid}) to your PayPal
        account, today. The order is still being processed; you insist on starting the return
        now.""",
        [find, order_details(oid)],
        expect="refuse",
        refused=call(
            "return_delivered_order_items",
            order_id=oid,
            item_ids=["7579176349"],
            payment_method_id="paypal_4970705",
        ),
    )

    uid, oid = "sofia_kovacs_7075", "#W7736983"
    who, find = ident(uid, "email")
    task(
        f"""{who} Exchange the coffee maker you received for the {options("3062461148")}
        model, which a friend recommended. You want exactly that model and no other.""",
        [find, user_details(uid), order_details(oid), product_details("3062461148")],
        expect="refuse",
        refused=call(
            "exchange_delivered_order_items",
            order_id=oid,
            item_ids=["5952720925"],
            new_item_ids=["3062461148"],
            payment_method_id="paypal_6840891",
        ),
    )

    uid, oid = "juan_smith_9901", "#W6484127"
    who, find = ident(uid, "email")
    task(
        f"""{who} Your vacuum cleaner order {oid} is being processed. You want the vacuum
        changed to the robotic, bagless model with a HEPA filter, paid with your gift card,
        before it ships.""",
        [find, order_details(oid), product_details("4725166838")],
        expect="refuse",
        refused=call(
            "modify_pending_order_items",
            order_id=oid,
            item_ids=["1304426904"],
            new_item_ids=["4725166838"],
            payment_method_id="gift_card_9106672",
        ),
    )

    uid, oid = "chen_anderson_8078", "#W1701126"
    who, find = ident(uid, "zip")
    task(
        f"""{who} Exchange the smart thermostat you received (Google Assistant, stainless
        steel) for the Apple HomeKit one in stainless steel. The difference must come from
        your gift card; your Mastercard is not an option for you.""",
        [find, user_details(uid), order_details(oid), product_details("9480266227")],
        expect="refuse",
        refused=call(
            "exchange_delivered_order_items",
            order_id=oid,
            item_ids=["2791467853"],
            new_item_ids=["9480266227"],
            payment_method_id="gift_card_3434432",
        ),
    )


# -- handoffs --------------------------------------------------------------------------------


def handoffs() -> None:
    uid, oid = "ava_nguyen_2175", "#W9126675"
    who, find = ident(uid, "email")
    task(
        f"""{who} Your order with the cycling helmet, the smart watch and the toothbrush
        shows as delivered, but the parcel never reached you. You want it investigated and a
        replacement sent; if the agent cannot do that, ask for a human.""",
        [
            find,
            user_details(uid),
            order_details(oid),
            call(
                "transfer_to_human_agents",
                summary=f"Order {oid} shows delivered but the customer never received it; "
                "wants an investigation and a replacement.",
            ),
        ],
        expect="handoff",
    )

    uid, oid = "emma_brown_8847", "#W9196189"
    who, find = ident(uid, "zip")
    task(
        f"""{who} A refund for your cancelled order {oid} still does not appear on your Visa
        statement. You want a person from the billing team to look into it; ask to be
        transferred.""",
        [
            find,
            order_details(oid),
            call(
                "transfer_to_human_agents",
                summary=f"Refund for cancelled order {oid} is missing from the customer's "
                "card statement; customer asks for a human.",
            ),
        ],
        expect="handoff",
    )

    uid, oid = "olivia_smith_5265", "#W5220869"
    who, find = ident(uid, "email")
    task(
        f"""{who} The desk lamp in your delivered order {oid} is now cheaper in the shop.
        You want the difference refunded as a price adjustment, without returning anything;
        if the agent cannot do it, ask for a person who can.""",
        [
            find,
            order_details(oid),
            call(
                "transfer_to_human_agents",
                summary=f"Customer requests a price adjustment on the desk lamp in {oid}.",
            ),
        ],
        expect="handoff",
    )

    uid, notes, grill = "raj_sanchez_2970", "#W7736708", "#W1067251"
    who, find = ident(uid, "zip")
    task(
        f"""{who} First, return the notebook from your delivered order with the headphones
        and the luggage set, refunded to the credit card you paid with; ask the amount. Then:
        the lid hinge of the charcoal grill you received broke and you want a technician to
        repair it. Ask for a human for the repair.""",
        [
            find,
            user_details(uid),
            order_details(notes),
            order_details(grill),
            call(
                "return_delivered_order_items",
                order_id=notes,
                item_ids=["6574183535"],
                payment_method_id="credit_card_3362387",
            ),
            call(
                "transfer_to_human_agents",
                summary=f"Grill in {grill} has a broken lid hinge; customer wants a repair.",
            ),
        ],
        expect="handoff",
        outputs=(money(price("6574183535")),),
        checks=(status_is(notes, "return requested"),),
    )

    uid, oid = "liam_li_5260", "#W9653558"
    who, find = ident(uid, "zip")
    task(
        f"""{who} You want to add a second pet bed to your pending order {oid} so that both
        arrive together. If that cannot be done by the agent, ask for a human.""",
        [
            find,
            order_details(oid),
            call(
                "transfer_to_human_agents",
                summary=f"Customer wants to add a second pet bed to pending order {oid}.",
            ),
        ],
        expect="handoff",
    )


def build() -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The tasks, and the writes the refusal tasks ask for."""
    TASKS.clear()
    REFUSED.clear()
    for section in (
        cancellations,
        order_addresses,
        item_changes,
        payment_changes,
        user_addresses,
        returns,
        exchanges,
        combined,
        refusals,
        handoffs,
    ):
        section()
    return list(TASKS), dict(REFUSED)


def render() -> str:
    tasks, _ = build()
    document = {"format": "harness.tasks", "version": 1, "tasks": tasks}
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    target = HERE / "tasks.json"
    text = render()
    if "--check" in argv:
        same = target.exists() and target.read_text(encoding="utf-8") == text
        print("tasks.json is up to date" if same else "tasks.json differs from the generator")
        return 0 if same else 1
    target.write_text(text, encoding="utf-8")
    print(f"wrote {len(json.loads(text)['tasks'])} tasks to {target.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

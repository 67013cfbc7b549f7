"""The tau2-bench retail tools, plain (non-transactional in the harness sense), on SQLite.

Each public method of :class:`RetailTools` is one upstream tool, with upstream's name, argument
names and types, and behaviour: the same validations in the same order, the same error
messages, the same mutations and the same return values (records in the shape of upstream's
``model_dump()``, optional fields included as ``None``). The one deliberate difference is
atomicity: every write tool runs in a single SQLite transaction, so a tool that fails leaves the
database exactly as it was (upstream mutates its in-memory models as it goes and can stop half
way, e.g. a cancellation whose second refund finds no payment method).

Upstream behaviours a wrapper must respect (they are reproduced, not fixed):

- ``modify_pending_order_items`` gives *every* modified item the price and options of the
  *last* new item in ``new_item_ids`` (upstream reuses the loop variable ``variant``), while the
  payment or refund it records is the true sum of per-item differences, not rounded (for
  example ``71.96000000000001``). Gift card balances are always rounded to 2 decimals.
- ``exchange_delivered_order_items`` rounds the price difference to 2 decimals, records it and
  checks a gift card can cover it, but moves no money; ``return_delivered_order_items`` moves no
  money either. Both store the item ids sorted.
- "Pending" means exactly ``"pending"`` for cancel and item modification, but any status that
  contains ``"pending"`` (so also ``"pending (item modified)"``) for address and payment changes.

:func:`upstream_error` runs a tool as a dry run (its validations read, nothing is written) to
tell what upstream would answer a call: the words the agent is shown when the harness refuses it.
"""

from __future__ import annotations

import functools
import json
import unicodedata
from collections.abc import Mapping
from typing import Any, ClassVar, Final

from harness.domains.records import writing
from harness.domains.retail.db import DATABASE, Record
from harness.domains.tau2 import Tau2Tools, UpstreamError, upstream_error

__all__ = [
    "READ_TOOLS",
    "TOOL_TYPES",
    "WRITE_TOOLS",
    "RetailError",
    "RetailTools",
    "upstream_error",
]


class RetailError(UpstreamError):
    """A retail tool refused the call; ``str(error)`` is upstream's message for the agent."""


TOOL_TYPES: Final[Mapping[str, str]] = {
    "calculate": "generic",
    "cancel_pending_order": "write",
    "exchange_delivered_order_items": "write",
    "find_user_id_by_email": "read",
    "find_user_id_by_name_zip": "read",
    "get_item_details": "read",
    "get_order_details": "read",
    "get_product_details": "read",
    "get_user_details": "read",
    "list_all_product_types": "read",
    "modify_pending_order_address": "write",
    "modify_pending_order_items": "write",
    "modify_pending_order_payment": "write",
    "modify_user_address": "write",
    "return_delivered_order_items": "write",
    "transfer_to_human_agents": "generic",
}
"""Every retail tool with upstream's ``ToolType`` (``read``, ``write`` or ``generic``)."""

WRITE_TOOLS: Final[tuple[str, ...]] = tuple(n for n, t in TOOL_TYPES.items() if t == "write")
"""The tools that change the database (each in one transaction)."""

READ_TOOLS: Final[tuple[str, ...]] = tuple(n for n, t in TOOL_TYPES.items() if t != "write")
"""The tools that never write: upstream's read tools and its two generic ones."""

_CANCEL_REASONS: Final = frozenset({"no longer needed", "ordered by mistake"})


@functools.lru_cache(maxsize=8192)
def _fold(text: str) -> str:
    """Case- and accent-folded ``text``, as upstream's ``fold_for_match`` compares names
    (remembered: a search folds every user's email or name, the same ones trial after trial)."""
    decomposed = unicodedata.normalize("NFD", text.strip())
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch)).casefold()


def _is_gift_card(payment_method: Mapping[str, Any]) -> bool:
    return bool(payment_method.get("source") == "gift_card")


def _payment(transaction_type: str, amount: float, payment_method_id: str) -> Record:
    # Upstream builds an OrderPayment, whose float field turns an int amount into a float.
    return {
        "transaction_type": transaction_type,
        "amount": float(amount),
        "payment_method_id": payment_method_id,
    }


def _address(address1: str, address2: str, city: str, state: str, country: str, zip: str) -> Record:
    # UserAddress's field order, which is not the order of the tools' arguments.
    return {
        "address1": address1,
        "address2": address2,
        "city": city,
        "country": country,
        "state": state,
        "zip": zip,
    }


def _find_item(order: Record, item_id: str) -> Record | None:
    return next((item for item in order["items"] if item["item_id"] == item_id), None)


class RetailTools(Tau2Tools):
    """All the tools of the retail domain, over one SQLite connection (with the generic
    ``calculate`` and ``transfer_to_human_agents`` of :class:`Tau2Tools`).

    Args:
        conn: A connection opened with ``isolation_level=None`` (see
            :func:`harness.domains.retail.db.connect`). Write tools open their own transaction
            (``BEGIN IMMEDIATE``), or a savepoint when the caller already has one open, so they
            can join a caller's transaction.

    Raises:
        ValueError: If the connection manages transactions itself (``isolation_level`` set).
    """

    TOOL_TYPES: ClassVar[Mapping[str, str]] = TOOL_TYPES
    ERROR: ClassVar[type[UpstreamError]] = RetailError

    # -- transactions and storage -------------------------------------------------------------

    def _writing(self) -> Any:
        """One transaction for the block's writes (none in a dry run: the block only reads)."""
        return writing(self.conn)

    def _fetch(self, table: str, key: str) -> Record | None:
        return DATABASE.fetch(self.conn, table, key)

    def _put(self, table: str, record: Record) -> None:
        DATABASE.put(self.conn, table, record)

    def _adjust_gift_card(self, user_id: str, payment_method_id: str, amount: float) -> None:
        """Add ``amount`` (negative to charge) to a gift card, rounding as upstream does."""
        user = self._get_user(user_id)
        method = user["payment_methods"][payment_method_id]
        method["balance"] = round(method["balance"] + amount, 2)
        self._put("users", user)

    # -- shared reads (upstream's private helpers, same messages) ------------------------------

    def _get_order(self, order_id: str) -> Record:
        order = self._fetch("orders", order_id)
        if order is None:
            raise RetailError("Order not found")
        return order

    def _get_user(self, user_id: str) -> Record:
        user = self._fetch("users", user_id)
        if user is None:
            raise RetailError("User not found")
        return user

    def _get_product(self, product_id: str) -> Record:
        product = self._fetch("products", product_id)
        if product is None:
            raise RetailError("Product not found")
        return product

    def _get_item(self, item_id: str) -> Record:
        for (variants,) in self.conn.execute("SELECT variants FROM products ORDER BY rowid"):
            found: Record | None = json.loads(variants).get(item_id)
            if found is not None:
                return found
        raise RetailError("Item not found")

    def _get_variant(self, product_id: str, variant_id: str) -> Record:
        variants: dict[str, Record] = self._get_product(product_id)["variants"]
        if variant_id not in variants:
            raise RetailError("Variant not found")
        return variants[variant_id]

    def _get_payment_method(self, user_id: str, payment_method_id: str) -> Record:
        methods: dict[str, Record] = self._get_user(user_id)["payment_methods"]
        if payment_method_id not in methods:
            raise RetailError("Payment method not found")
        return methods[payment_method_id]

    @staticmethod
    def _is_pending_order(order: Record) -> bool:
        """Upstream's loose check: any status containing "pending"."""
        return "pending" in order["status"]

    @staticmethod
    def _check_items_in_order(order: Record, item_ids: list[str], message: str) -> None:
        """Raise ``message`` (``{item_id}`` filled in) if an id is asked for more times than
        the order holds it."""
        all_item_ids = [item["item_id"] for item in order["items"]]
        for item_id in item_ids:
            if item_ids.count(item_id) > all_item_ids.count(item_id):
                raise RetailError(message.format(item_id=item_id))

    # -- read tools ----------------------------------------------------------------------------

    def find_user_id_by_email(self, email: str) -> str:
        """Find a user id by email. If the user is not found, an error is returned.

        Args:
            email: The email of the user, such as 'something@example.com'.

        Returns:
            The user id.

        Raises:
            RetailError: If no user has that email (compared ignoring case and accents).
        """
        wanted = _fold(email)
        for user_id, user_email in self.conn.execute(
            "SELECT user_id, email FROM users ORDER BY rowid"
        ):
            if _fold(user_email) == wanted:
                return str(user_id)
        raise RetailError("User not found")

    def find_user_id_by_name_zip(self, first_name: str, last_name: str, zip: str) -> str:
        """Find a user id by first name, last name and zip code. If the user is not found, an
        error is returned. Find the user by email by default; use this only if the user cannot
        be found by email or cannot remember their email.

        Args:
            first_name: The first name of the customer, such as 'John'.
            last_name: The last name of the customer, such as 'Doe'.
            zip: The zip code of the customer, such as '12345'.

        Returns:
            The user id.

        Raises:
            RetailError: If no user matches (names ignoring case and accents, zip exactly).
        """
        wanted_first, wanted_last = _fold(first_name), _fold(last_name)
        # Only the users with that zip are read (an exact match, as upstream's), in order.
        for user_id, name in self.conn.execute(
            "SELECT user_id, name FROM users WHERE json_extract(address, '$.zip') = ? "
            "AND json_type(address, '$.zip') = 'text' ORDER BY rowid",
            (zip,),
        ):
            name = json.loads(name)
            if (
                _fold(name["first_name"]) == wanted_first
                and _fold(name["last_name"]) == wanted_last
            ):
                return str(user_id)
        raise RetailError("User not found")

    def get_order_details(self, order_id: str) -> Record:
        """Get the status and details of an order.

        Args:
            order_id: The order id, such as '#W0000000'. Mind the '#' at the beginning of the
                order id.

        Returns:
            The order details.

        Raises:
            RetailError: If the order is not found.
        """
        return self._get_order(order_id)

    def get_product_details(self, product_id: str) -> Record:
        """Get the inventory details of a product, with all its items (variants).

        Args:
            product_id: The product id, such as '6086499569'. A product id is not an item id.

        Returns:
            The product details.

        Raises:
            RetailError: If the product is not found.
        """
        return self._get_product(product_id)

    def get_item_details(self, item_id: str) -> Record:
        """Get the inventory details of an item (one variant of a product).

        Args:
            item_id: The item id, such as '6086499569'. An item id is not a product id.

        Returns:
            The item details: options, availability and price.

        Raises:
            RetailError: If the item is not found.
        """
        return self._get_item(item_id)

    def get_user_details(self, user_id: str) -> Record:
        """Get the details of a user, including their orders.

        Args:
            user_id: The user id, such as 'sara_doe_496'.

        Returns:
            The user details.

        Raises:
            RetailError: If the user is not found.
        """
        return self._get_user(user_id)

    def list_all_product_types(self) -> str:
        """List the name and product id of every product type.

        Each product type has several items, each with its own item id and options. There are
        only 50 product types in the store.

        Returns:
            A JSON object mapping product names to product ids, sorted by name.
        """
        rows = self.conn.execute("SELECT name, product_id FROM products ORDER BY rowid")
        return json.dumps(dict(rows.fetchall()), sort_keys=True)

    # -- write tools ---------------------------------------------------------------------------

    def cancel_pending_order(self, order_id: str, reason: str) -> Record:
        """Cancel a pending order. An order already processed or delivered cannot be cancelled.
        The agent must explain the cancellation and get explicit user confirmation (yes/no)
        first. The order becomes 'cancelled' and its payments are refunded: at once to a gift
        card, otherwise within 5-7 business days.

        Args:
            order_id: The order id, such as '#W0000000'. Mind the '#' at the beginning of the
                order id.
            reason: The reason for cancelling: either 'no longer needed' or 'ordered by mistake'.

        Returns:
            The order details after the cancellation.

        Raises:
            RetailError: If the order is not found or not pending, the reason is not one of the
                two, or a payment's method is not found.
        """
        with self._writing():
            order = self._get_order(order_id)
            if order["status"] != "pending":
                raise RetailError("Non-pending order cannot be cancelled")
            if reason not in _CANCEL_REASONS:
                raise RetailError("Invalid reason")
            refunds = []
            for payment in order["payment_history"]:
                payment_id = payment["payment_method_id"]
                refunds.append(_payment("refund", payment["amount"], payment_id))
                method = self._get_payment_method(order["user_id"], payment_id)
                if _is_gift_card(method):
                    self._adjust_gift_card(order["user_id"], payment_id, payment["amount"])
            order["status"] = "cancelled"
            order["cancel_reason"] = reason
            order["payment_history"].extend(refunds)
            self._put("orders", order)
            return order

    def exchange_delivered_order_items(
        self,
        order_id: str,
        item_ids: list[str],
        new_item_ids: list[str],
        payment_method_id: str,
    ) -> Record:
        """Exchange items of a delivered order for new items of the same product type. A
        delivered order can be returned or exchanged only once by the agent. The agent must
        explain the exchange and get explicit user confirmation (yes/no) first.

        Args:
            order_id: The order id, such as '#W0000000'. Mind the '#' at the beginning of the
                order id.
            item_ids: The item ids to exchange, each such as '1008292230'. The list may hold
                duplicates.
            new_item_ids: The item ids to exchange them for, each such as '1008292230'. The list
                may hold duplicates. Each new item must be of the same product as the item at
                the same position in item_ids.
            payment_method_id: The payment method that pays or receives the price difference,
                such as 'gift_card_0000000' or 'credit_card_0000000'; found in the user's or
                the order's details.

        Returns:
            The order details after the exchange request.

        Raises:
            RetailError: If the order is not found or not delivered, the items are not in the
                order, the lists differ in length, a new item does not exist for that product or
                is unavailable, the payment method is not found, or a gift card cannot cover
                the price difference.
        """
        with self._writing():
            order = self._get_order(order_id)
            if order["status"] != "delivered":
                raise RetailError("Non-delivered order cannot be exchanged")
            self._check_items_in_order(order, item_ids, "Number of {item_id} not found.")
            if len(item_ids) != len(new_item_ids):
                raise RetailError("The number of items to be exchanged should match.")
            diff_price: float = 0
            for item_id, new_item_id in zip(item_ids, new_item_ids, strict=True):
                item = _find_item(order, item_id)
                if item is None:
                    raise RetailError(f"Item {item_id} not found")
                variant = self._get_variant(item["product_id"], new_item_id)
                if not variant["available"]:
                    raise RetailError(f"New item {new_item_id} not found or available")
                diff_price += variant["price"] - item["price"]
            diff_price = round(diff_price, 2)
            method = self._get_payment_method(order["user_id"], payment_method_id)
            if _is_gift_card(method) and method["balance"] < diff_price:
                raise RetailError("Insufficient gift card balance to pay for the price difference")
            order["status"] = "exchange requested"
            order["exchange_items"] = sorted(item_ids)
            order["exchange_new_items"] = sorted(new_item_ids)
            order["exchange_payment_method_id"] = payment_method_id
            order["exchange_price_difference"] = diff_price
            self._put("orders", order)
            return order

    def modify_pending_order_address(
        self,
        order_id: str,
        address1: str,
        address2: str,
        city: str,
        state: str,
        country: str,
        zip: str,
    ) -> Record:
        """Modify the shipping address of a pending order. The agent must explain the change and
        get explicit user confirmation (yes/no) first.

        Args:
            order_id: The order id, such as '#W0000000'. Mind the '#' at the beginning of the
                order id.
            address1: The first line of the address, such as '123 Main St'.
            address2: The second line of the address, such as 'Apt 1' or ''.
            city: The city, such as 'San Francisco'.
            state: The state, such as 'CA'.
            country: The country, such as 'USA'.
            zip: The zip code, such as '12345'.

        Returns:
            The order details after the change.

        Raises:
            RetailError: If the order is not found or not pending.
        """
        with self._writing():
            order = self._get_order(order_id)
            if not self._is_pending_order(order):
                raise RetailError("Non-pending order cannot be modified")
            order["address"] = _address(address1, address2, city, state, country, zip)
            self._put("orders", order)
            return order

    def modify_pending_order_items(
        self,
        order_id: str,
        item_ids: list[str],
        new_item_ids: list[str],
        payment_method_id: str,
    ) -> Record:
        """Modify items of a pending order to new items of the same product type. This can be
        done only once per pending order. The agent must explain the change and get explicit
        user confirmation (yes/no) first.

        Args:
            order_id: The order id, such as '#W0000000'. Mind the '#' at the beginning of the
                order id.
            item_ids: The item ids to modify, each such as '1008292230'. The list may hold
                duplicates.
            new_item_ids: The item ids to modify them to, each such as '1008292230'. The list
                may hold duplicates. Each new item must be of the same product as the item at
                the same position in item_ids.
            payment_method_id: The payment method that pays or receives the price difference,
                such as 'gift_card_0000000' or 'credit_card_0000000'; found in the user's or
                the order's details.

        Returns:
            The order details after the change.

        Raises:
            RetailError: If the order is not found or not exactly 'pending', the items are not
                in the order, the lists differ in length, a new item equals its old item, does
                not exist for that product or is unavailable, the payment method is not found,
                or a gift card cannot cover the price difference.
        """
        with self._writing():
            order = self._get_order(order_id)
            if order["status"] != "pending":
                raise RetailError("Non-pending order cannot be modified")
            self._check_items_in_order(order, item_ids, "{item_id} not found")
            if len(item_ids) != len(new_item_ids):
                raise RetailError("The number of items to be exchanged should match")
            diff_price: float = 0
            variant: Record = {}
            for item_id, new_item_id in zip(item_ids, new_item_ids, strict=True):
                if item_id == new_item_id:
                    raise RetailError("The new item id should be different from the old item id")
                item = _find_item(order, item_id)
                if item is None:
                    raise RetailError(f"Item {item_id} not found")
                variant = self._get_variant(item["product_id"], new_item_id)
                if not variant["available"]:
                    raise RetailError(f"New item {new_item_id} not found or available")
                diff_price += variant["price"] - item["price"]
            method = self._get_payment_method(order["user_id"], payment_method_id)
            if _is_gift_card(method) and method["balance"] < diff_price:
                raise RetailError("Insufficient gift card balance to pay for the new item")
            # Not rounded, as upstream: the amount keeps float noise (71.96000000000001).
            order["payment_history"].append(
                _payment(
                    "payment" if diff_price > 0 else "refund", abs(diff_price), payment_method_id
                )
            )
            if _is_gift_card(method):
                self._adjust_gift_card(order["user_id"], payment_method_id, -diff_price)
            for item_id, new_item_id in zip(item_ids, new_item_ids, strict=True):
                item = _find_item(order, item_id)
                if item is None:  # pragma: no cover - the loop above found every one
                    raise RetailError(f"Item {item_id} not found")
                item["item_id"] = new_item_id
                # Upstream's behaviour, kept for fidelity: every item takes the price and options
                # of the last variant looked up above, not of its own new item.
                item["price"] = variant["price"]
                item["options"] = dict(variant["options"])
            order["status"] = "pending (item modified)"
            self._put("orders", order)
            return order

    def modify_pending_order_payment(self, order_id: str, payment_method_id: str) -> Record:
        """Modify the payment method of a pending order. The agent must explain the change and
        get explicit user confirmation (yes/no) first.

        Args:
            order_id: The order id, such as '#W0000000'. Mind the '#' at the beginning of the
                order id.
            payment_method_id: The payment method to pay with instead, such as
                'gift_card_0000000' or 'credit_card_0000000'; found in the user's or the
                order's details.

        Returns:
            The order details after the change.

        Raises:
            RetailError: If the order is not found or not pending, the payment method is not
                found, the order has other than exactly one payment, the new method is the
                current one, or a gift card cannot cover the amount.
        """
        with self._writing():
            order = self._get_order(order_id)
            if not self._is_pending_order(order):
                raise RetailError("Non-pending order cannot be modified")
            method = self._get_payment_method(order["user_id"], payment_method_id)
            history = order["payment_history"]
            if len(history) != 1 or history[0]["transaction_type"] != "payment":
                raise RetailError("There should be exactly one payment for a pending order")
            old_method_id = history[0]["payment_method_id"]
            if old_method_id == payment_method_id:
                raise RetailError("The new payment method should be different from the current one")
            amount = history[0]["amount"]
            if _is_gift_card(method) and method["balance"] < amount:
                raise RetailError("Insufficient gift card balance to pay for the order")
            history.extend(
                [
                    _payment("payment", amount, payment_method_id),
                    _payment("refund", amount, old_method_id),
                ]
            )
            if _is_gift_card(method):
                self._adjust_gift_card(order["user_id"], payment_method_id, -amount)
            old_method = self._get_payment_method(order["user_id"], old_method_id)
            if _is_gift_card(old_method):
                self._adjust_gift_card(order["user_id"], old_method_id, amount)
            self._put("orders", order)
            return order

    def modify_user_address(
        self,
        user_id: str,
        address1: str,
        address2: str,
        city: str,
        state: str,
        country: str,
        zip: str,
    ) -> Record:
        """Modify the default address of a user. The agent must explain the change and get
        explicit user confirmation (yes/no) first.

        Args:
            user_id: The user id, such as 'sara_doe_496'.
            address1: The first line of the address, such as '123 Main St'.
            address2: The second line of the address, such as 'Apt 1' or ''.
            city: The city, such as 'San Francisco'.
            state: The state, such as 'CA'.
            country: The country, such as 'USA'.
            zip: The zip code, such as '12345'.

        Returns:
            The user details after the change.

        Raises:
            RetailError: If the user is not found.
        """
        with self._writing():
            user = self._get_user(user_id)
            user["address"] = _address(address1, address2, city, state, country, zip)
            self._put("users", user)
            return user

    def return_delivered_order_items(
        self, order_id: str, item_ids: list[str], payment_method_id: str
    ) -> Record:
        """Request the return of some items of a delivered order; the order becomes 'return
        requested'. The agent must explain the return and get explicit user confirmation
        (yes/no) first. The user will get a follow-up email on how and where to return the
        items.

        Args:
            order_id: The order id, such as '#W0000000'. Mind the '#' at the beginning of the
                order id.
            item_ids: The item ids to return, each such as '1008292230'. The list may hold
                duplicates.
            payment_method_id: The payment method that receives the refund, such as
                'gift_card_0000000' or 'credit_card_0000000': the order's original payment
                method or a gift card; found in the user's or the order's details.

        Returns:
            The order details after the return request.

        Raises:
            RetailError: If the order is not found or not delivered, the user or payment method
                is not found, the payment method is neither the original one nor a gift card,
                or the items are not in the order.
        """
        with self._writing():
            order = self._get_order(order_id)
            if order["status"] != "delivered":
                raise RetailError("Non-delivered order cannot be returned")
            user = self._get_user(order["user_id"])
            method = self._get_payment_method(user["user_id"], payment_method_id)
            if not _is_gift_card(method):
                if not order["payment_history"]:
                    # Upstream indexes payment_history[0] here and raises IndexError.
                    raise RetailError("list index out of range")
                if payment_method_id != order["payment_history"][0]["payment_method_id"]:
                    raise RetailError("Payment method should be the original payment method")
            self._check_items_in_order(order, item_ids, "Some item not found")
            order["status"] = "return requested"
            order["return_items"] = sorted(item_ids)
            order["return_payment_method_id"] = payment_method_id
            self._put("orders", order)
            return order

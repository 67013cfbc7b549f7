"""The decorator: what it keeps, what it exposes, what it refuses."""

from __future__ import annotations

import functools
import inspect
from typing import Any

import pytest

import harness as hx


@hx.action(writes=["orders/{order_id}"])
def cancel_order(order_id: str, reason: str = "no longer needed", quantity: int = 1) -> dict:
    """Cancel a pending order.

    Args:
        order_id: The order to cancel, such as '#W0001'.
        reason: Why the customer cancels it;
            one of the allowed reasons.
        quantity: How many.

    Returns:
        The order.
    """
    return {}


def test_wrapper_keeps_name_signature_and_docstring():
    """The action looks like the function it wraps to frameworks that introspect it."""
    assert cancel_order.__name__ == "cancel_order"
    assert "Cancel a pending order." in (cancel_order.__doc__ or "")
    assert list(inspect.signature(cancel_order).parameters) == ["order_id", "reason", "quantity"]
    assert cancel_order.__wrapped__.__annotations__["quantity"] == "int"


def _passed_through(fn: Any) -> Any:
    """A decorator of the usual kind: one wrapper code for every function it wraps."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return call


def test_each_wrapped_function_gets_its_own_arguments():
    """Two different functions under one name, wrapped by one decorator (the same wrapper
    code, the same docstring), each give their action their own arguments and signature; a
    wrapper stating its own ``__signature__`` is read by it."""

    def get(order_id: str) -> str:
        return order_id

    first = hx.action(_passed_through(get), name="get")

    def get(user_id: str, page: int = 0) -> str:  # type: ignore[no-redef]
        return user_id

    second = hx.action(_passed_through(get), name="get")
    assert first.arg_names == ["order_id"] and list(first.schema["properties"]) == ["order_id"]
    assert second.arg_names == ["user_id", "page"]
    assert list(inspect.signature(second).parameters) == ["user_id", "page"]
    assert second.schema["properties"]["page"]["default"] == 0

    stated = _passed_through(get)
    stated.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("user_id", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str)]
    )
    third = hx.action(stated, name="get")
    assert third.arg_names == ["user_id"]
    assert list(inspect.signature(third).parameters) == ["user_id"]


class _Shelf:
    def take(self, item: str) -> str:
        """Take an item."""
        return item


def _typed_as(kind: type) -> Any:
    def put(item):  # type: ignore[no-untyped-def]
        """Put an item."""
        return item

    put.__annotations__ = {"item": kind}
    return put


def test_a_method_bound_or_not_and_closures_typed_apart_get_their_own_models():
    """The class's function (``self`` first) and the bound method (no ``self``) are two
    signatures; two closures of one code whose arguments are typed differently are two
    models."""
    unbound = hx.action(_Shelf.take, name="take")
    bound = hx.action(_Shelf().take, name="take")
    assert list(inspect.signature(unbound).parameters) == ["self", "item"]
    assert list(inspect.signature(bound).parameters) == ["item"] == bound.arg_names
    as_int, as_str = hx.action(_typed_as(int), name="put"), hx.action(_typed_as(str), name="put")
    assert as_int.schema["properties"]["item"]["type"] == "integer"
    assert as_str.schema["properties"]["item"]["type"] == "string"
    assert inspect.signature(as_str).parameters["item"].annotation is str


def test_schema_comes_from_signature_and_docstring():
    """The JSON Schema has the arguments' types, defaults, requirements and descriptions."""
    schema = cancel_order.schema
    assert schema["required"] == ["order_id"]
    assert schema["properties"]["quantity"] == {
        "type": "integer",
        "default": 1,
        "description": "How many.",
    }
    assert schema["properties"]["reason"]["description"] == (
        "Why the customer cancels it; one of the allowed reasons."
    )
    assert schema["additionalProperties"] is False


def test_openai_tool_format():
    """The OpenAI function-calling form names the tool, describes it, and embeds the schema."""
    tool = cancel_order.openai_tool
    assert tool["type"] == "function"
    assert tool["function"]["name"] == "cancel_order"
    assert tool["function"]["description"] == "Cancel a pending order."
    assert tool["function"]["parameters"] is cancel_order.schema


def _described(fn: Any) -> tuple[str, dict[str, str | None]]:
    act = hx.action(fn)
    props = act.schema["properties"]
    return act.description, {n: props[n].get("description") for n in props}


def test_numpy_style_docstring_describes_arguments():
    """A NumPy-style docstring gives the description and each argument's description."""

    def refund(order_id: str, amount: float = 0.0) -> None:
        """Refund an order.

        Parameters
        ----------
        order_id : str
            The order to refund,
            such as '#W0001'.
        amount : float, optional
            How much to refund.

        Returns
        -------
        None
        """

    assert _described(refund) == (
        "Refund an order.",
        {"order_id": "The order to refund, such as '#W0001'.", "amount": "How much to refund."},
    )


def test_rest_style_docstring_describes_arguments():
    """A reST-style docstring gives the description and each argument's description."""

    def refund(order_id: str, amount: float = 0.0) -> None:
        """Refund an order.

        :param order_id: The order to refund,
            such as '#W0001'.
        :type order_id: str
        :param amount: How much to refund.
        :returns: nothing.
        """

    assert _described(refund) == (
        "Refund an order.",
        {"order_id": "The order to refund, such as '#W0001'.", "amount": "How much to refund."},
    )


def test_google_style_description_keeps_lines_starting_with_a_role():
    """A Google description line starting with a reST role (``:class:``) is text, not a field,
    and a Note section stays out of the description."""

    def refund(order_id: str) -> None:
        """Refund an order, as a
        :class:`Refund` entry.

        Note:
            Not for gift cards.

        Args:
            order_id: The order.
        """

    assert _described(refund) == (
        "Refund an order, as a :class:`Refund` entry.",
        {"order_id": "The order."},
    )


def test_async_function_stays_async():
    """Decorating an async def gives an action whose calls are awaitable."""

    @hx.action
    async def fetch(x: int) -> int:
        """Fetch."""
        return x

    assert fetch.is_async and not cancel_order.is_async


def test_bad_decorator_options_are_named():
    """Misused options fail at decoration time with the fix in the message."""
    with pytest.raises(
        hx.ConfigurationError, match=r"writes name \['missing'\], which are not arguments"
    ):
        hx.action(writes=["orders/{missing}"])(lambda order_id: None)  # type: ignore[arg-type]
    with pytest.raises(hx.ConfigurationError, match="list of patterns"):

        @hx.action(writes="orders/{x}")  # type: ignore[arg-type]
        def f(x: str) -> None: ...

    with pytest.raises(hx.ConfigurationError, match="name every argument"):

        @hx.action
        def g(*args: Any) -> None: ...

    with pytest.raises(hx.ConfigurationError, match="timeout must be > 0"):
        hx.action(timeout=0)(lambda: None)
    with pytest.raises(hx.ConfigurationError, match="already an action"):
        hx.action(cancel_order)  # type: ignore[arg-type]
    with pytest.raises(hx.ConfigurationError, match="already has a compensation"):
        act = hx.action(writes=["x"])(lambda: None)
        act.compensation(lambda ctx: None)
        act.compensation(lambda ctx: None)


def test_keys_come_from_identity_not_position():
    """The default key hashes name and arguments; a key function overrides it."""
    a = cancel_order.validate(("o1",), {})
    b = cancel_order.validate((), {"order_id": "o1", "reason": "no longer needed"})
    assert cancel_order.key_for(a) == cancel_order.key_for(b)
    assert cancel_order.key_for(a) != cancel_order.key_for(cancel_order.validate(("o2",), {}))
    keyed = hx.action(writes=["x/{k}"], idempotency_key=lambda a: a.k.upper())(
        lambda k: None  # type: ignore[arg-type,return-value]
    )
    assert keyed.key_for(keyed.validate(("ab",), {})) == "<lambda>:AB"


def test_scope_templates_resolve_per_call():
    """writes templates fill in from the call's arguments; a callable computes them."""
    assert cancel_order.scope(cancel_order.validate(("o7",), {})) == ["orders/o7"]
    dyn = hx.action(writes=lambda a: [f"u/{a.x}", "log/*"])(lambda x: None)  # type: ignore
    assert dyn.scope(dyn.validate(("1",), {})) == ["u/1", "log/*"]
    assert dyn.mutating and not hx.action(lambda: None).mutating


def test_public_namespace_is_sorted_and_complete():
    """harness exports a sorted __all__ whose every name exists."""
    assert hx.__all__ == sorted(hx.__all__)
    for name in hx.__all__:
        assert hasattr(hx, name), name


def test_exceptions_share_one_root():
    """Every error the harness raises derives from HarnessError."""
    for name in hx.__all__:
        obj = getattr(hx, name)
        if isinstance(obj, type) and issubclass(obj, Exception) and obj is not hx.TransientError:
            assert issubclass(obj, hx.HarnessError), name
    assert issubclass(hx.ScopeViolation, hx.ActionFailed)


def test_an_action_copied_around_another_function_keeps_its_checks_apart() -> None:
    """``Action._around`` (environments copy the actions they make every trial): the copy has
    the new function, key and scope function, the original's checks in lists of its own, no
    undo; a scope that is a list of patterns cannot be swapped for a function."""

    def ship(order_id: str) -> str:
        """Ship an order."""
        return order_id

    def scope(args: Any) -> list[str]:
        return [f"orders/{args.order_id}"]

    made = hx.Action(ship, writes=scope, idempotency_key=lambda a: a.order_id)
    made.precondition(lambda ctx: True)
    made.compensation(lambda ctx: None)

    def other(order_id: str) -> str:
        """Ship an order."""
        return "other " + order_id

    def other_scope(args: Any) -> list[str]:
        return []

    copy = made._around(other, idempotency_key=str, writes=other_scope)
    assert copy.fn is other and copy.idempotency_key is str and copy.writes is other_scope
    assert copy.preconditions == made.preconditions
    assert copy.preconditions is not made.preconditions and copy.compensate is None
    copy.postcondition(lambda ctx: True)
    assert made.postconditions == [] and made.writes is scope
    listed = hx.Action(ship, writes=["orders/{order_id}"])
    with pytest.raises(hx.ConfigurationError, match="writes is a function"):
        listed._around(other, idempotency_key=str, writes=other_scope)

"""What the openai agent's tests share: the shop's tools, an episode on it, an agent on a fake
server whose backoff goes to the fake clock."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import harness as hx
from harness.agents.base import Toolbox
from harness.agents.openai import OpenAIAgent
from harness.testing import FakeClock
from harness.testing.model_server import FakeChatServer

from ..conftest import Shop


def shop_tools(shop: Shop) -> dict[str, Any]:
    """A cancel action (pending orders only, undoable) and a read tool over the shop."""

    @hx.action(writes=["orders/{order_id}"], idempotency_key=lambda a: a.order_id)
    def cancel_order(order_id: str) -> dict[str, Any]:
        """Cancel a pending order.

        Args:
            order_id: the order to cancel.
        """
        return shop.set_status(order_id, "cancelled")

    @cancel_order.precondition
    def is_pending(ctx: hx.Context) -> bool:
        order = ctx.state.get(f"orders/{ctx.args.order_id}")
        return order is not None and order["status"] == "pending"

    @cancel_order.postcondition
    def is_cancelled(ctx: hx.Context) -> bool:
        return bool(ctx.after[f"orders/{ctx.args.order_id}"]["status"] == "cancelled")

    cancel_order.compensation(shop.restore)

    def get_order(order_id: str) -> dict[str, Any]:
        """Look up an order.

        Args:
            order_id: the order to look up.
        """
        return dict(shop.state[f"orders/{order_id}"])

    return {"cancel_order": cancel_order, "get_order": get_order}


@pytest.fixture
def episode(shop: Shop, store: hx.Store, clock: FakeClock) -> Iterator[hx.Episode]:
    """An open episode on the shop."""
    with hx.Episode(state=shop.state, store=store, clock=clock) as ep:
        yield ep


@pytest.fixture
def toolbox(shop: Shop, episode: hx.Episode) -> Toolbox:
    """The shop's tools in the open episode."""
    return Toolbox(shop_tools(shop), episode)


def agent_for(server: FakeChatServer, clock: FakeClock, **options: Any) -> OpenAIAgent:
    """An agent on the fake server whose backoff sleeps go to the fake clock."""
    options.setdefault("model", "fake-model")
    return OpenAIAgent(base_url=server.base_url, sleep=clock.sleep, **options)

"""Action identity is exact: one name in an episode is one action object."""

from __future__ import annotations

from typing import Any

import pytest

import harness as hx
from harness.testing import FakeClock


class Ledger:
    """Accounts on a DictState, and every deposit the tools applied."""

    def __init__(self) -> None:
        self.state = hx.DictState({"acct/a": {"balance": 0}})
        self.applied: list[int] = []

    def add(self, name: str, amount: int) -> None:
        acct = self.state[f"acct/{name}"]
        acct["balance"] += amount
        self.state[f"acct/{name}"] = acct
        self.applied.append(amount)


def deposit_of(ledger: Ledger, amount: int, **options: Any) -> hx.Action[..., int]:
    """One factory function: every action it makes has the same code, another closure."""

    def deposit(name: str) -> int:
        ledger.add(name, amount)
        return amount

    return hx.action(deposit, writes=["acct/{name}"], **options)


def episode(ledger: Ledger, store: hx.Store, **kw: Any) -> hx.Episode:
    """An episode on the ledger with a fake clock."""
    return hx.Episode(state=ledger.state, store=store, clock=FakeClock(), **kw)


@pytest.mark.parametrize(
    "options",
    [{}, {"idempotency_key": lambda a: a.name}],
    ids=["argument-hash", "key-function"],
)
def test_two_actions_of_one_factory_are_refused_not_answered_from_the_first(
    store: hx.Store, options: dict[str, Any]
):
    """A second action object made by the same factory under the same name is refused (nothing
    runs, the refusal is recorded) instead of getting the first one's recorded result."""
    ledger = Ledger()
    one, hundred = deposit_of(ledger, 1, **options), deposit_of(ledger, 100, **options)
    with episode(ledger, store) as ep:
        assert one("a") == 1
        with pytest.raises(hx.ConfigurationError, match="two different actions") as info:
            hundred("a")
        assert "@hx.action(name=...)" in str(info.value) and "nothing ran" in str(info.value)
    assert ledger.applied == [1]
    assert ep.outcome == "committed"
    first, refused = store.transactions(ep.id)
    assert first.status == "committed"
    assert refused.status == "invalid" and "two different actions" in (refused.reason or "")
    assert "dedup" not in [r.kind for r in store.log(ep.id)]


def test_two_action_objects_under_one_name_given_to_an_episode_are_refused(store: hx.Store):
    """Episode(actions=[...]) holding two objects under one name is refused before it opens."""
    ledger = Ledger()
    with pytest.raises(hx.ConfigurationError, match="two different actions"):
        episode(ledger, store, actions=[deposit_of(ledger, 1), deposit_of(ledger, 100)])


def test_the_actions_given_on_resume_are_the_ones_the_agent_calls(store: hx.Store):
    """Resumed with Episode(actions=[...]), the agent calling those same objects is answered
    from the record for work done and runs what is new."""
    ledger = Ledger()
    one = deposit_of(ledger, 1)
    with episode(ledger, store, episode_id="e1") as ep:
        one("a")
    with episode(ledger, store, episode_id="e1", resume=True, actions=[one]) as again:
        assert one("a") == 1  # answered from the record
        with pytest.raises(hx.ConfigurationError, match="two different actions"):
            deposit_of(ledger, 100)("a")
    assert again.outcome == "committed"
    assert ledger.applied == [1]
    assert ep.id == again.id


def test_a_new_episode_takes_new_action_objects(store: hx.Store):
    """Actions made afresh for another episode (a new trial, a new process) are that episode's
    own: the one-object rule holds per episode, not per process."""
    ledger = Ledger()
    with episode(ledger, store, episode_id="e1"):
        deposit_of(ledger, 1)("a")
    with episode(ledger, store, episode_id="e1", resume=True, actions=[deposit_of(ledger, 1)]):
        pass
    with episode(ledger, store, episode_id="e2"):
        deposit_of(ledger, 100)("a")
    assert ledger.applied == [1, 100]

"""Shared fixtures: a fresh store per test, a fake clock, and a small shop to act on."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import harness as hx
from harness.testing import FakeClock


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """A SQLite store URL in a fresh folder."""
    return f"sqlite:///{tmp_path / 'logs' / 'harness.db'}"


@pytest.fixture
def store(store_url: str) -> Iterator[hx.Store]:
    """A fresh store, closed after the test."""
    s = hx.Store(store_url, create=True)
    yield s
    s.close()


@pytest.fixture
def clock() -> FakeClock:
    """A clock whose sleeps take no time."""
    return FakeClock()


class Shop:
    """A tiny shop on a DictState: orders with a status, and a ledger of applied effects."""

    def __init__(self) -> None:
        self.state = hx.DictState(
            {
                "orders/o1": {"status": "pending", "total": 10},
                "orders/o2": {"status": "pending", "total": 20},
                "orders/o3": {"status": "delivered", "total": 30},
                "audit/count": {"n": 0},
            }
        )
        self.applied: list[tuple[str, str]] = []

    def set_status(self, order_id: str, status: str) -> dict[str, Any]:
        order = self.state[f"orders/{order_id}"]
        order["status"] = status
        self.state[f"orders/{order_id}"] = order
        self.applied.append((order_id, status))
        return {"order_id": order_id, "status": status}

    def restore(self, ctx: hx.Context) -> None:
        restore_before(self.state, ctx)


def restore_before(state: hx.DictState, ctx: hx.Context) -> None:
    """The usual compensation: put back every value ``ctx.before`` holds (absent ones deleted)."""
    for key, value in ctx.before.items():
        if value is None:
            if key in state:
                del state[key]
        else:
            state[key] = value


SIGNING_KEY = hx.SigningKey.generate()


@pytest.fixture(scope="session")
def signed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run (``r1``) of three tasks x two trials by the scripted agent, every episode
    and the run signed with ``SIGNING_KEY``. Copy it before editing it."""
    from .toy_env import write_suite

    root = tmp_path_factory.mktemp("signed")
    suite = write_suite(root / "suite", [2, 1, 3])
    result = hx.run_trials(
        suite, agent="scripted", trials=2, logs=root / "logs", run_id="r1", signing_key=SIGNING_KEY
    )
    return result.folder


@pytest.fixture
def shop() -> Shop:
    """A fresh shop."""
    return Shop()


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run ``async def`` tests on a fresh event loop (no plugin needed)."""
    if inspect.iscoroutinefunction(pyfuncitem.obj):
        names = pyfuncitem._fixtureinfo.argnames
        asyncio.run(pyfuncitem.obj(**{n: pyfuncitem.funcargs[n] for n in names}))
        return True
    return None


# Modules whose tests join a Ray cluster by its address. A process that was connected to one
# Ray cluster cannot join another (Ray keeps the first cluster's id, and the second refuses
# its requests: "Wrong cluster ID token"), so they run first, before any test starts a local
# Ray in this process.
_RAY_CLUSTERS_FIRST = ("tests/runs/test_ray_hosts.py",)
# Tests that share one pytest-xdist worker process, run in the order collected: every module
# whose tests start or join Ray. That worker joins the two-host cluster before it starts a
# local Ray, and two workers never run Ray side by side.
_ONE_WORKER = dict.fromkeys(
    (
        *_RAY_CLUSTERS_FIRST,
        "tests/runs/test_ray.py",
        "tests/runs/test_ray_limits.py",
        "tests/store/test_postgres_ray.py",
    ),
    "ray",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the tests of :data:`_RAY_CLUSTERS_FIRST` before every other test."""
    root = Path(str(config.rootpath))

    def first(item: pytest.Item) -> bool:
        try:
            where = Path(str(item.path)).relative_to(root).as_posix()
        except ValueError:
            return False
        return where in _RAY_CLUSTERS_FIRST

    items[:] = [i for i in items if first(i)] + [i for i in items if not first(i)]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's scheduler (``-n``): each test goes to the next idle worker, except that
    the tests of one :data:`_ONE_WORKER` group all go to one worker, in order."""
    from xdist.scheduler import LoadScopeScheduling

    class Groups(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return _ONE_WORKER.get(nodeid.split("::", 1)[0], nodeid)

    return Groups(config, log)

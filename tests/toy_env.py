"""A tiny, fast environment for run tests: counters on a DictState."""

from __future__ import annotations

from typing import Any

import harness as hx


class ToyEnvironment:
    """Counters ``c/<name>`` starting at 0; one keyed, compensable write and one read."""

    TOOL_NAMES = frozenset({"bump", "look"})

    def __init__(self) -> None:
        self.state = hx.DictState({f"c/{n}": 0 for n in "abcdefgh"})
        state = self.state

        @hx.action(writes=["c/{name}"], idempotency_key=lambda a: f"{a.name}:{a.step}")
        def bump(name: str, step: int, amount: int = 1) -> int:
            """Add `amount` to counter `name`, as step number `step` of the plan."""
            if f"c/{name}" not in state:
                raise ValueError(f"no counter {name}")
            state[f"c/{name}"] = state[f"c/{name}"] + amount
            return int(state[f"c/{name}"])

        @bump.precondition
        def counter_exists(ctx: hx.Context) -> bool:
            return ctx.state.get(f"c/{ctx.args.name}") is not None

        @bump.postcondition
        def moved(ctx: hx.Context) -> bool:
            key = f"c/{ctx.args.name}"
            return bool(ctx.after[key] - ctx.before[key] == ctx.args.amount)

        @bump.compensation
        def undo(ctx: hx.Context) -> None:
            for key, value in ctx.before.items():
                state[key] = value

        def look(name: str) -> Any:
            """Read counter `name`."""
            return state.get(f"c/{name}")

        self.tools: dict[str, Any] = {"bump": bump, "look": look}

    def export(self) -> dict[str, Any]:
        return self.state.to_dict()

    def close(self) -> None:
        pass

    def extra_write(self, task: Any, rng: Any) -> tuple[str, dict[str, Any]]:
        """A write nobody asked for: bump counter h."""
        return "bump", {"name": "h", "step": 999}


def write_suite(folder: Any, steps: list[int]) -> Any:
    """A suite folder whose task i needs steps[i] writes (plus one read each)."""
    tasks = []
    for i, n in enumerate(steps):
        actions = [{"name": "look", "arguments": {"name": "a"}}]
        actions += [
            {"name": "bump", "arguments": {"name": "abcdefg"[j % 7], "step": j}} for j in range(n)
        ]
        tasks.append(
            {
                "id": f"t{i}",
                "version": "1",
                "instruction": f"bump {n} counters",
                "reference_actions": actions,
            }
        )
    return write_files(folder, "toy", "tests.toy_env:ToyEnvironment", tasks)


def write_files(
    folder: Any, name: str, environment: str, tasks: list[dict[str, Any]], **options: Any
) -> Any:
    """A suite folder: its manifest (named ``name``, on ``environment`` built with
    ``options``) and ``tasks.json`` with ``tasks``."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    manifest = {"name": name, "version": "1", "environment": environment}
    options_field = {"environment_options": options} if options else {}
    (folder / "suite.json").write_text(
        json.dumps({**manifest, **options_field, "tasks": ["tasks.json"]})
    )
    (folder / "tasks.json").write_text(
        json.dumps({"format": "harness.tasks", "version": 1, "tasks": tasks})
    )
    return folder

"""``simulated``: a seeded agent that follows the reference but makes mistakes at a set rate.

Every write of the reference is a *required step*. At each one the agent errs with probability
``p_i = min(1, error_rate * (1 + self_conditioning * errors_so_far))``: with
``self_conditioning > 0`` an earlier error makes later ones likelier, as measured in real agents.
An error takes one of the modes:

- ``wrong_argument``: the write is made with wrong arguments;
- ``skipped_step``: the write is not made;
- ``extra_write``: the write is made, then one more write nobody asked for;
- ``false_success``: the write is not made, and the agent says it was.

Reads are always made correctly: they change nothing, so errors there could not be seen in the
state. A trial's pass^1 therefore follows the p^n null model, with n the number of writes.
"""

from __future__ import annotations

import random
from typing import Any

from ..errors import ConfigurationError
from ..suite import Task, ToolCall
from .base import AgentOutput, Toolbox, registry
from .scripted import final_message

__all__ = ["MODES", "SimulatedAgent"]

MODES = ("wrong_argument", "skipped_step", "extra_write", "false_success")


def _perturb(value: Any, rng: random.Random) -> Any:
    """A value of the same kind that differs from ``value``."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + rng.choice([1, 2, 3])
    if isinstance(value, str):
        return value[:-1] + ("X" if not value.endswith("X") else "Y") if value else "X"
    if isinstance(value, list):
        return value[:-1] if value else ["X"]
    if isinstance(value, dict) and value:
        key = rng.choice(sorted(value))
        return {**value, key: _perturb(value[key], rng)}
    return "X"


def wrong_arguments(call: ToolCall, rng: random.Random) -> dict[str, Any]:
    """``call``'s arguments, every one changed (so the mistake cannot hide in an argument the
    tool ignores)."""
    if not call.arguments:
        return {"unexpected": "X"}
    return {key: _perturb(value, rng) for key, value in call.arguments.items()}


class SimulatedAgent:
    """A stochastic agent with a per-step error rate, error modes and self-conditioning.

    Args:
        error_rate: probability of an error at each required step (0..1).
        self_conditioning: how much each earlier error raises the rate (0: independent).
        modes: the error modes to draw from, uniformly.
    """

    name = "simulated"

    def __init__(
        self,
        error_rate: float = 0.1,
        self_conditioning: float = 0.0,
        modes: tuple[str, ...] | list[str] = MODES,
    ) -> None:
        if not 0.0 <= error_rate <= 1.0:
            raise ConfigurationError(f"simulated agent: error_rate={error_rate} must be in 0..1")
        if self_conditioning < 0:
            raise ConfigurationError("simulated agent: self_conditioning must be >= 0")
        unknown = set(modes) - set(MODES)
        if unknown or not modes:
            raise ConfigurationError(
                f"simulated agent: unknown modes {sorted(unknown)}; choose from {', '.join(MODES)}"
            )
        self.error_rate = error_rate
        self.self_conditioning = self_conditioning
        self.modes = tuple(modes)

    def config(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "error_rate": self.error_rate,
            "self_conditioning": self.self_conditioning,
            "modes": list(self.modes),
        }

    def run(self, task: Task, toolbox: Toolbox, *, seed: int) -> AgentOutput:
        rng = random.Random(seed)
        errors: list[dict[str, Any]] = []
        claimed_false = False
        for index, call in enumerate(task.reference_actions):
            if not toolbox.is_write(call.name):
                toolbox.call(call.name, dict(call.arguments))
                continue
            rate = min(1.0, self.error_rate * (1 + self.self_conditioning * len(errors)))
            if rng.random() >= rate:
                toolbox.call(call.name, dict(call.arguments))
                continue
            mode = rng.choice(self.modes)
            errors.append({"step": index, "mode": mode, "tool": call.name})
            if mode == "wrong_argument":
                toolbox.call(call.name, wrong_arguments(call, rng))
            elif mode == "extra_write":
                toolbox.call(call.name, dict(call.arguments))
                self._extra_write(task, toolbox, call, rng)
            elif mode == "false_success":
                claimed_false = True
            # skipped_step: nothing
        message = final_message(task)
        if claimed_false:
            message += " All steps were completed successfully."
        return AgentOutput(message=message, claimed_success=True, meta={"errors": errors})

    @staticmethod
    def _extra_write(task: Task, toolbox: Toolbox, call: ToolCall, rng: random.Random) -> None:
        """One write nobody asked for: the environment's suggestion, or a perturbed repeat."""
        hook = getattr(toolbox.environment, "extra_write", None)
        extra = hook(task, rng) if callable(hook) else None
        if extra is not None:
            name, arguments = extra
            toolbox.call(name, arguments)
        else:
            toolbox.call(call.name, wrong_arguments(call, rng))


registry.register("simulated", SimulatedAgent)

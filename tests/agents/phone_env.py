"""A tiny dual-control environment for tests: the agent reads a line, the user holds a phone."""

from __future__ import annotations

from typing import Any

import harness as hx


class PhoneEnvironment:
    """A line the agent can look up and a phone only the user can touch (airplane mode on)."""

    policy = "Help the customer get service back."

    def __init__(self) -> None:
        self.state = hx.DictState({"line/l1": {"status": "active"}, "phone/p1": {"airplane": True}})
        state = self.state

        def get_line(line_id: str) -> Any:
            """Look up line `line_id`."""
            line = state.get(f"line/{line_id}")
            if line is None:
                raise ValueError(f"Line {line_id} not found")
            return line

        @hx.action(writes=["phone/p1"])
        def toggle_airplane_mode() -> str:
            """Toggle the phone's airplane mode."""
            phone = dict(state["phone/p1"])
            phone["airplane"] = not phone["airplane"]
            state["phone/p1"] = phone
            return f"Airplane mode is now {'ON' if phone['airplane'] else 'OFF'}."

        @toggle_airplane_mode.postcondition
        def flipped(ctx: hx.Context) -> bool:
            return bool(ctx.after["phone/p1"]["airplane"] != ctx.before["phone/p1"]["airplane"])

        @toggle_airplane_mode.compensation
        def flip_back(ctx: hx.Context) -> None:
            state["phone/p1"] = ctx.before["phone/p1"]

        def check_status_bar() -> str:
            """What the phone's status bar shows."""
            return "Airplane Mode" if state["phone/p1"]["airplane"] else "Signal: excellent"

        self.tools: dict[str, Any] = {"get_line": get_line}
        self.user_tools: dict[str, Any] = {
            "toggle_airplane_mode": toggle_airplane_mode,
            "check_status_bar": check_status_bar,
        }

    def export(self) -> dict[str, Any]:
        return self.state.to_dict()

    def close(self) -> None:
        pass

"""Make ``telecom_probes.json``: tau2-bench's own telecom environment answering a fixed
sequence of tool calls from each task's initial state, for the differential test in
``test_telecom_probes.py``.

Run with tau2-bench's code importable (a checkout at commit a2c0247 with its requirements and
its telecom data, MIT licence): ``TAU2_SRC=path/to/tau2-bench python
tests/domains/make_telecom_probes.py``. Each probe records what tau2's
``Environment.get_response`` gives for one call (the tool message's text and whether it is an
error) and both databases' hashes after it, on one environment per task that every call of the
sequence changes in turn.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TASKS = HERE.parents[1] / "tasks" / "telecom" / "tau2_tasks_small.json"
OUT = HERE / "telecom_probes.json"

C, L = "C1001", "L1002"
HASH = 16  # (hex digits of each database hash kept: enough to tell any two states apart)

# (requestor, tool, arguments): reads of both sides, then writes of both sides and their
# errors, then the reads again.
READS: list[tuple[str, str, dict[str, Any]]] = [
    ("user", "check_status_bar", {}),
    ("user", "check_network_status", {}),
    ("user", "check_network_mode_preference", {}),
    ("user", "run_speed_test", {}),
    ("user", "check_sim_status", {}),
    ("user", "check_data_restriction_status", {}),
    ("user", "check_apn_settings", {}),
    ("user", "check_wifi_status", {}),
    ("user", "check_wifi_calling_status", {}),
    ("user", "check_vpn_status", {}),
    ("user", "check_installed_apps", {}),
    ("user", "check_app_status", {"app_name": "messaging"}),
    ("user", "check_app_permissions", {"app_name": "messaging"}),
    ("user", "check_app_status", {"app_name": "no_such_app"}),
    ("user", "can_send_mms", {}),
    ("user", "check_payment_request", {}),
    ("assistant", "get_customer_by_phone", {"phone_number": "555-123-2002"}),
    ("assistant", "get_customer_by_phone", {"phone_number": "000"}),
    ("assistant", "get_customer_by_id", {"customer_id": C}),
    ("assistant", "get_customer_by_id", {"customer_id": "C0"}),
    ("assistant", "get_customer_by_name", {"full_name": "John Smith", "dob": "1985-06-15"}),
    ("assistant", "get_details_by_id", {"id": L}),
    ("assistant", "get_details_by_id", {"id": "B1234321"}),
    ("assistant", "get_details_by_id", {"id": "X1"}),
    ("assistant", "get_bills_for_customer", {"customer_id": C, "limit": 2}),
    ("assistant", "get_data_usage", {"customer_id": C, "line_id": L}),
    ("assistant", "get_data_usage", {"customer_id": C, "line_id": "L9"}),
]
WRITES: list[tuple[str, str, dict[str, Any]]] = [
    ("user", "toggle_airplane_mode", {}),
    ("user", "check_status_bar", {}),
    ("user", "toggle_airplane_mode", {}),
    ("user", "toggle_data", {}),
    ("user", "toggle_data", {}),
    ("user", "toggle_roaming", {}),
    ("user", "toggle_roaming", {}),
    ("user", "toggle_data_saver_mode", {}),
    ("user", "toggle_data_saver_mode", {}),
    ("user", "toggle_wifi", {}),
    ("user", "toggle_wifi_calling", {}),
    ("user", "toggle_wifi_calling", {}),
    ("user", "toggle_wifi", {}),
    ("user", "connect_vpn", {}),
    ("user", "disconnect_vpn", {}),
    ("user", "disconnect_vpn", {}),
    ("user", "set_network_mode_preference", {"mode": "4g_5g_preferred"}),
    ("user", "set_network_mode_preference", {"mode": "no_such_mode"}),
    ("user", "set_network_mode_preference", {"mode": "2g_only"}),
    ("user", "reset_apn_settings", {}),
    ("user", "grant_app_permission", {"app_name": "messaging", "permission": "sms"}),
    ("user", "grant_app_permission", {"app_name": "messaging", "permission": "storage"}),
    ("user", "grant_app_permission", {"app_name": "no_such_app", "permission": "sms"}),
    ("user", "reseat_sim_card", {}),
    ("user", "reboot_device", {}),
    ("user", "make_payment", {}),
    ("assistant", "enable_roaming", {"customer_id": C, "line_id": L}),
    ("assistant", "disable_roaming", {"customer_id": C, "line_id": L}),
    ("assistant", "disable_roaming", {"customer_id": C, "line_id": L}),
    ("assistant", "enable_roaming", {"customer_id": C, "line_id": "L9"}),
    ("assistant", "refuel_data", {"customer_id": C, "line_id": L, "gb_amount": 2.0}),
    ("assistant", "refuel_data", {"customer_id": C, "line_id": L, "gb_amount": -1}),
    ("assistant", "refuel_data", {"customer_id": C}),
    ("assistant", "send_payment_request", {"customer_id": C, "bill_id": "B1234321"}),
    ("user", "check_payment_request", {}),
    ("user", "make_payment", {}),
    ("assistant", "send_payment_request", {"customer_id": C, "bill_id": "B0"}),
    ("assistant", "suspend_line", {"customer_id": C, "line_id": L, "reason": "travel"}),
    ("user", "check_status_bar", {}),
    ("assistant", "suspend_line", {"customer_id": C, "line_id": L, "reason": "again"}),
    ("assistant", "resume_line", {"customer_id": C, "line_id": L}),
    ("assistant", "resume_line", {"customer_id": C, "line_id": L}),
    ("assistant", "suspend_line", {"customer_id": C, "line_id": "L9", "reason": "x"}),
    ("assistant", "transfer_to_human_agents", {"summary": "The user needs a person."}),
    ("user", "reboot_device", {}),
    ("user", "no_such_tool", {}),
]
SEQUENCE = [*READS, *WRITES, *READS[:16]]


def main() -> None:
    src = os.environ.get("TAU2_SRC")
    if not src:
        sys.exit("set TAU2_SRC to a tau2-bench checkout (commit a2c0247) with its telecom data")
    sys.path.insert(0, str(Path(src) / "src"))
    from loguru import logger

    logger.remove()
    from tau2.data_model.message import ToolCall
    from tau2.data_model.tasks import Task
    from tau2.registry import registry

    build = registry.get_env_constructor("telecom")
    probes = []
    for raw in json.loads(TASKS.read_text(encoding="utf-8")):
        task = Task.model_validate(raw)
        env = build()
        env.set_state(
            initialization_data=None,
            initialization_actions=task.initial_state.initialization_actions,
            message_history=[],
        )
        answers = []
        for i, (requestor, name, arguments) in enumerate(SEQUENCE):
            call = ToolCall(id=str(i), name=name, arguments=arguments, requestor=requestor)
            message = env.get_response(call)
            answers.append(
                {
                    "content": message.content,
                    "error": message.error,
                    "db_hash": env.get_db_hash()[:HASH],
                    "user_db_hash": env.get_user_db_hash()[:HASH],
                }
            )
        probes.append({"task": task.id, "answers": answers})
    document = {
        "source": (
            "tau2-bench (sierra-research/tau2-bench, commit a2c0247, MIT licence): its telecom "
            "Environment.get_response, made by tests/domains/make_telecom_probes.py"
        ),
        "sequence": [{"requestor": r, "name": n, "arguments": a} for r, n, a in SEQUENCE],
        "probes": probes,
    }
    text = json.dumps(document, indent=0, ensure_ascii=False, separators=(",", ":"))
    OUT.write_text(text + "\n", encoding="utf-8")
    print(f"wrote {len(probes)} tasks x {len(SEQUENCE)} calls to {OUT.name}")


if __name__ == "__main__":
    main()

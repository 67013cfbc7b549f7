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

# (env_type, function, arguments): the functions tasks set up and score with (initialization
# actions, env assertions), run as tau2's run_env_function_call runs them, on one environment
# per task of FUNCTION_TASKS.
U, A = "user", "assistant"
FUNCTIONS: list[tuple[str, str, dict[str, Any]]] = [
    (U, "set_user_location", {"abroad": True}),
    (U, "turn_roaming_on", {}),
    (U, "check_status_bar", {}),
    (U, "turn_roaming_off", {}),
    (U, "set_user_location", {"abroad": False}),
    (U, "turn_airplane_mode_on", {}),
    (U, "assert_airplane_mode_status", {"expected_status": True}),
    (U, "assert_service_status", {"expected_status": "connected"}),
    (U, "turn_airplane_mode_off", {}),
    (U, "assert_service_status", {"expected_status": "connected"}),
    (U, "assert_service_status", {"expected_status": "no_such_status"}),
    (U, "unseat_sim_card", {}),
    (U, "check_sim_status", {}),
    (U, "reseat_sim_card", {}),
    (U, "lock_sim_card", {"mode": "pin"}),
    (U, "check_sim_status", {}),
    (U, "lock_sim_card", {"mode": "puk"}),
    (U, "check_sim_status", {}),
    (U, "turn_data_off", {}),
    (U, "assert_mobile_data_status", {"expected_status": False}),
    (U, "turn_data_on", {}),
    (U, "turn_data_saver_mode_on", {}),
    (U, "assert_mobile_data_saver_mode_status", {"expected_status": True}),
    (U, "turn_data_saver_mode_off", {}),
    (U, "assert_mobile_roaming_status", {"expected_status": False}),
    (U, "break_apn_settings", {}),
    (U, "check_apn_settings", {}),
    (U, "run_speed_test", {}),
    (U, "reset_apn_settings", {}),
    (U, "break_apn_mms_setting", {}),
    (U, "can_send_mms", {}),
    (U, "assert_can_send_mms", {"expected_status": False}),
    (U, "set_apn_settings", {"apn_settings": {"apn_name": "internet", "mmsc_url": "x"}}),
    (U, "reset_apn_settings", {}),
    (U, "set_wifi_calling", {"enabled": True, "mms_over_wifi": True}),
    (U, "check_wifi_calling_status", {}),
    (U, "set_wifi_calling", {"enabled": False}),
    (U, "break_vpn", {}),
    (U, "check_vpn_status", {}),
    (U, "run_speed_test", {}),
    (U, "assert_internet_not_excellent", {}),
    (U, "disconnect_vpn", {}),
    (U, "remove_app_permission", {"app_name": "messaging", "permission": "sms"}),
    (U, "can_send_mms", {}),
    (U, "remove_app_permission", {"app_name": "messaging", "permission": "no_such"}),
    (U, "remove_app_permission", {"app_name": "no_such_app", "permission": "sms"}),
    (U, "grant_app_permission", {"app_name": "messaging", "permission": "sms"}),
    (U, "simulate_network_search", {}),
    (U, "assert_internet_speed", {"expected_speed": 100.0}),
    (U, "assert_internet_speed", {"expected_speed": 0.0, "expected_desc": "no_connection"}),
    (U, "assert_mobile_data_usage_exceeded", {"expected_status": False}),
    (A, "set_data_usage", {"customer_id": C, "line_id": L, "data_used_gb": 15.0}),
    (U, "assert_mobile_data_usage_exceeded", {"expected_status": True}),
    (U, "run_speed_test", {}),
    (A, "assert_data_refueling_amount", {"customer_id": C, "line_id": L, "expected_amount": 0}),
    (A, "assert_line_status", {"customer_id": C, "line_id": L, "expected_status": "Active"}),
    (A, "assert_overdue_bill_exists", {"customer_id": C, "overdue_bill_id": "B1234321"}),
    (A, "assert_no_overdue_bill", {"overdue_bill_id": "B1234321"}),
    (
        A,
        "suspend_line_for_overdue_bill",
        {"customer_id": C, "line_id": L, "new_bill_id": "B9", "contract_ended": False},
    ),
    (A, "assert_overdue_bill_exists", {"customer_id": C, "overdue_bill_id": "B9"}),
    (U, "check_status_bar", {}),
    (U, "check_payment_request", {}),
    (
        A,
        "suspend_line_for_overdue_bill",
        {"customer_id": C, "line_id": L, "new_bill_id": "B10", "contract_ended": True},
    ),
    (A, "get_available_plan_ids", {}),
    (U, "reboot_device", {}),
    (U, "check_status_bar", {}),
]
FUNCTION_TASKS = 3  # (the first task of each kind in the file: mobile data, service, MMS)


def plain(value: Any) -> Any:
    """A function's return value as JSON holds it (a tuple as a list, a model or an enum as
    its JSON form)."""
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if hasattr(value, "value") and not isinstance(value, str | int | float | bool):
        return value.value
    return value


def main() -> None:
    src = os.environ.get("TAU2_SRC")
    if not src:
        sys.exit("set TAU2_SRC to a tau2-bench checkout (commit a2c0247) with its telecom data")
    sys.path.insert(0, str(Path(src) / "src"))
    from loguru import logger

    logger.remove()
    from tau2.data_model.message import ToolCall
    from tau2.data_model.tasks import EnvFunctionCall, Task
    from tau2.domains.telecom.user_tools import TelecomUserTools
    from tau2.registry import registry

    build = registry.get_env_constructor("telecom")
    # tau2 hands every phone of the process one VpnDetails object that break_vpn makes poor in
    # place: each task starts from the details a fresh process has, as its own run would.
    vpn = TelecomUserTools.default_vpn_details.model_copy(deep=True)
    probes = []
    for raw in json.loads(TASKS.read_text(encoding="utf-8")):
        task = Task.model_validate(raw)
        TelecomUserTools.default_vpn_details = vpn.model_copy(deep=True)
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
    functions = []
    kinds: dict[str, str] = {}
    for raw in json.loads(TASKS.read_text(encoding="utf-8")):
        kinds.setdefault(raw["id"].split("]")[0], raw["id"])
    for task_id in list(kinds.values())[:FUNCTION_TASKS]:
        task = next(
            Task.model_validate(t)
            for t in json.loads(TASKS.read_text(encoding="utf-8"))
            if t["id"] == task_id
        )
        TelecomUserTools.default_vpn_details = vpn.model_copy(deep=True)
        env = build()
        env.set_state(
            initialization_data=None,
            initialization_actions=task.initial_state.initialization_actions,
            message_history=[],
        )
        answers = []
        for env_type, name, arguments in FUNCTIONS:
            call = EnvFunctionCall(env_type=env_type, func_name=name, arguments=arguments)
            try:
                value: Any = {"value": plain(env.run_env_function_call(call))}
            except Exception as exc:
                value = {"error": f"{type(exc).__name__}: {exc}"}
            answers.append(
                {
                    **value,
                    "db_hash": env.get_db_hash()[:HASH],
                    "user_db_hash": env.get_user_db_hash()[:HASH],
                }
            )
        functions.append({"task": task.id, "answers": answers})
    document = {
        "source": (
            "tau2-bench (sierra-research/tau2-bench, commit a2c0247, MIT licence): its telecom "
            "Environment.get_response, made by tests/domains/make_telecom_probes.py"
        ),
        "sequence": [{"requestor": r, "name": n, "arguments": a} for r, n, a in SEQUENCE],
        "probes": probes,
        "functions": [{"env_type": e, "name": n, "arguments": a} for e, n, a in FUNCTIONS],
        "function_probes": functions,
    }
    text = json.dumps(document, indent=0, ensure_ascii=False, separators=(",", ":"))
    OUT.write_text(text + "\n", encoding="utf-8")
    print(
        f"wrote {len(probes)} tasks x {len(SEQUENCE)} calls and {len(functions)} tasks x "
        f"{len(FUNCTIONS)} functions to {OUT.name}"
    )


if __name__ == "__main__":
    main()

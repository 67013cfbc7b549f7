"""The telecom domain's data is tau2-bench's, byte for byte, beside its MIT notice.

The digests below are SHA-256 of upstream's files at commit
a2c024725189473d2d7cea3a5cfdbcc67478e41f (github.com/sierra-research/tau2-bench,
data/tau2/domains/telecom/); the policy's composition is upstream's ``get_environment``
(src/tau2/domains/telecom/environment.py, policy_type "manual").
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from harness.domains import telecom

ROOT = Path(__file__).resolve().parents[2]

UPSTREAM_SHA256 = {
    "db.toml": "562d647ef9d7df8df91eafd8ee76036e707c8f9e32aaedc4a7fde06975aea2c0",
    "user_db.toml": "4886107ea0c16f8e16d74bef91cfb557de61822afe9361f5a9b241806aea2e4c",
    "main_policy.md": "95943844a0cf11fdf0e2842b483b81d9f9338aa53235712ed131db075d086ed7",
    "tech_support_manual.md": "015a3ee49ec8c199c5e1a059c922081937b92cf3a5ea74fedbc4357816f389ba",
}
TASKS_SMALL_SHA256 = "c8ea6f75adc18a8ad363974292cbd26b6e8b0e348ec87d265a4188e0088a8f24"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_the_shipped_files_are_upstreams_with_its_notice() -> None:
    assert set(UPSTREAM_SHA256) == set(telecom.UPSTREAM_FILES)
    for name, expected in UPSTREAM_SHA256.items():
        assert _sha256(telecom.DATA.joinpath(name).read_bytes()) == expected, name
    notice = telecom.DATA.joinpath("LICENSE").read_text()
    assert notice.startswith("MIT License\n\nCopyright (c) 2025 Sierra Research\n")
    tasks = ROOT / "tasks" / "telecom"
    assert _sha256((tasks / "tau2_tasks_small.json").read_bytes()) == TASKS_SMALL_SHA256
    assert (tasks / "LICENSE").read_text() == notice


def test_the_databases_parse_as_upstream_reads_them() -> None:
    db = telecom.load_db()
    assert {k: len(v) for k, v in db.items()} == {
        "plans": 5,
        "devices": 9,
        "lines": 9,
        "customers": 4,
        "bills": 6,
    }
    assert db["plans"][0] == {
        "plan_id": "P1001",
        "name": "Basic Plan",
        "data_limit_gb": 5.0,
        "price_per_month": 40.0,
        "data_refueling_price_per_gb": 5.0,
    }
    device = telecom.load_user_db()["device"]
    assert device["airplane_mode"] is False and device["network_mode_preference"] == (
        "4g_5g_preferred"
    )
    assert set(device["app_statuses"]) == {"messaging", "browser"}
    assert telecom.load_db() is not db  # a fresh copy each time


def test_the_policy_is_composed_as_tau2_composes_it() -> None:
    text = telecom.policy()
    main = telecom.DATA.joinpath("main_policy.md").read_text()
    manual = telecom.DATA.joinpath("tech_support_manual.md").read_text()
    assert text == (
        f"<main_policy>\n{main}\n</main_policy>\n<tech_support_policy>\n{manual}\n"
        "</tech_support_policy>"
    )


def test_tasks_small_holds_tau2s_twenty_tasks() -> None:
    tasks = json.loads((ROOT / "tasks" / "telecom" / "tau2_tasks_small.json").read_text())
    assert len(tasks) == 20
    assert {t["user_scenario"]["instructions"]["domain"] for t in tasks} == {"telecom"}

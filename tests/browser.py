"""Headless Chromium for tests that check an HTML page is really laid out."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)

needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium is not installed (apt-get install chromium)"
)


def layout(page: Path, probe: str, profile: Path) -> tuple[Any, str]:
    """Open ``page`` with ``probe`` (a script writing JSON into ``<pre id="layout">``) appended,
    and return what the probe measured and the DOM Chromium ended with."""
    html = page.read_text(encoding="utf-8").replace("</body>", probe)
    probed = page.with_name(page.stem + "-probed.html")
    probed.write_text(html, encoding="utf-8")
    assert CHROMIUM is not None
    done = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--dump-dom",
            probed.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    dom = done.stdout
    assert done.returncode == 0 and "</html>" in dom, done.stderr[-2000:]
    found = re.search(r'<pre id="layout">(.*?)</pre>', dom)
    assert found, "the layout probe did not run"
    return json.loads(found.group(1)), dom

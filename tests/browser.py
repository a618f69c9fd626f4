"""Headless Chromium for the tests that open a page as a reader's browser does: its DOM after the
page's scripts ran (``--dump-dom``). Skips where Chromium is missing, unless KVFAST_REQUIRE_PROBE=1
(``make test``, CI: .ci/run installs it), where its absence fails."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest


def chromium() -> str:
    """The Chromium executable (skips, or fails under KVFAST_REQUIRE_PROBE=1, where there is none)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("KVFAST_REQUIRE_PROBE") == "1":
            pytest.fail("the browser tests need chromium (apt-get install -y chromium)")
        pytest.skip("chromium is not installed")
    return found


def dump_dom(url: str, budget_ms: int = 8000) -> str:
    """The page at ``url`` (file:// works) after its scripts ran for ``budget_ms`` of virtual time."""
    r = subprocess.run(
        [
            chromium(),
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            "--no-first-run",
            f"--virtual-time-budget={budget_ms}",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def element_attrs(dom: str, element_id: str) -> dict[str, str]:
    """The attributes of the element of id ``element_id`` in a dumped DOM."""
    m = re.search(rf'<\w+ id="{element_id}"([^>]*)>', dom)
    assert m is not None, dom[-2000:]
    return dict(re.findall(r'([\w-]+)="([^"]*)"', m.group(1)))

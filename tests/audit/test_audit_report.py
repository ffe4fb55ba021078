"""The HTML report in a real headless Chromium: the page renders and its charts are drawn.

Needs Debian's ``chromium`` (tests/chromium_support.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpu_admission.auditlog.report import ALLOWED_COLOR, DENIED_COLOR
from tests.chromium_support import FLAGS, chromium_or_skip, count_color, decode_png

DATA = Path(__file__).parent.parent / "data" / "audit"


@pytest.fixture
def chromium() -> str:
    return chromium_or_skip()


def test_report_renders_with_charts_in_headless_chromium(chromium: str, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    subprocess.run([sys.executable, "-m", "gpu_admission", "audit", "report", "--out",
                    str(page), str(DATA / "decisions.log*"), str(DATA / "apiserver-audit.log")],
                   check=True, capture_output=True, timeout=120)
    shot = tmp_path / "shot.png"
    profile = tmp_path / "profile"
    subprocess.run([chromium, *FLAGS, f"--user-data-dir={profile}", f"--screenshot={shot}",
                    page.as_uri()], check=True, capture_output=True, timeout=120)
    dom = subprocess.run([chromium, *FLAGS, f"--user-data-dir={profile}", "--dump-dom",
                          page.as_uri()], check=True, capture_output=True, timeout=120).stdout
    # The browser parsed the page into three SVG charts with bars in them.
    assert dom.count(b'class="chart"') == 3
    assert dom.count(b'data-series="denied"') == 3  # 3 days with denials
    assert b"<rect" in dom

    width, height, rows = decode_png(shot.read_bytes())
    assert (width, height) == (1200, 900)
    colours = {row[i:i + 3] for row in rows[::7] for i in range(0, len(row), 21)}
    assert len(colours) > 20, "screenshot looks blank"
    # Bars are painted: solid areas in the exact chart colours (thousands of pixels each).
    assert count_color(rows, DENIED_COLOR) > 1000
    assert count_color(rows, ALLOWED_COLOR) > 5000

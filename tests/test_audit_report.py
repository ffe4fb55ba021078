"""The HTML report in a real headless Chromium: the page renders and its charts are drawn.

Needs Debian's ``chromium`` (apt-get install -y chromium). Without it the test is skipped
locally, but fails under CI (``CI`` set), where it must be installed.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from gpu_admission.auditlog.report import ALLOWED_COLOR, DENIED_COLOR

DATA = Path(__file__).parent / "data" / "audit"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1200,900"]


def decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and raw pixel rows of an 8-bit RGB/RGBA non-interlaced PNG
    (what Chromium writes); enough to count colours without an imaging library."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):  # PNG filter types 0-4 (RFC 2083 section 6)
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 0xFF
        rows.append(bytes(line if bpp == 3 else
                          b"".join(line[i:i + 3] for i in range(0, stride, 4))))
        prev = line
    return width, height, rows


def count_color(rows: list[bytes], hex_color: str) -> int:
    rgb = bytes.fromhex(hex_color.lstrip("#"))
    return sum(sum(1 for i in range(0, len(row), 3) if row[i:i + 3] == rgb) for row in rows)


@pytest.fixture
def chromium() -> str:
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed but CI is set: install it "
                        "(apt-get install -y chromium)")
        pytest.skip("chromium not installed (apt-get install -y chromium); CI runs this")
    return CHROMIUM


def test_report_renders_with_charts_in_headless_chromium(chromium: str, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    subprocess.run([sys.executable, "-m", "gpu_admission", "audit", "report", "--html",
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

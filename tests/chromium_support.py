"""Headless Chromium for the HTML reports (audit report, utilisation report): the binary,
the flags this machine needs, and a PNG decoder to count the colours of a screenshot.

Needs Debian's ``chromium`` (``.ci/run`` installs it). Without it a test is skipped locally
and fails under CI (``CI`` set).
"""

from __future__ import annotations

import os
import shutil
import struct
import zlib

import pytest

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


def chromium_or_skip() -> str:
    """The chromium binary; skip locally without it, fail under CI."""
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed but CI is set: install it "
                        "(apt-get install -y chromium)")
        pytest.skip("chromium not installed (apt-get install -y chromium); CI runs this")
    return CHROMIUM

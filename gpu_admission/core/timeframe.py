"""Time inputs of ``gpu-admission report`` and ``reclaim`` and of the policy's working hours,
parsed strictly: durations, instants, the range, working hours and the time zone. Pure (the
current time is passed in); a core value module (floor 0) because the policy model reads it.

Every parser raises :class:`ValueError` with a message naming the option, what was expected
and what was given; the CLI turns it into a usage error (exit 2).

Working hours are the *user's*: ``--working-hours "Mon-Fri 08:00-18:00"`` in ``--tz`` (an IANA
zone, default UTC). The companion alert rules evaluate in UTC, so a team outside UTC gets a
different "working time" from them unless it passes its own ``--tz``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

DAYS: Final = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_UNITS: Final = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# Prometheus duration syntax: one or more <int><unit>, largest unit first, e.g. 1h30m.
_DURATION_RE: Final = re.compile(r"^(?:(\d+)(ms|s|m|h|d|w))+$")
_DURATION_PART_RE: Final = re.compile(r"(\d+)(ms|s|m|h|d|w)")
_HOURS_RE: Final = re.compile(r"^\s*(\S+)\s+(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*$")


def parse_duration(text: str, option: str) -> int:
    """Whole seconds of a Prometheus-style duration (``5m``, ``7d``, ``1h30m``), > 0."""
    value = text.strip()
    if not _DURATION_RE.match(value):
        raise ValueError(f"{option}: expected a duration like 5m, 12h or 7d, got {text!r}")
    seconds = sum(int(n) * _UNITS[u] for n, u in _DURATION_PART_RE.findall(value))
    if seconds < 1 or not float(seconds).is_integer():
        raise ValueError(f"{option}: expected a duration of at least 1s in whole seconds, "
                         f"got {text!r}")
    return int(seconds)


def parse_instant(text: str, option: str, tz: ZoneInfo) -> float:
    """Unix seconds from RFC 3339 (``2026-11-30T08:00:00Z``), a date-time without offset (read
    in ``tz``), or unix seconds."""
    value = text.strip()
    try:
        return float(value)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"{option}: expected an RFC 3339 time like 2026-11-30T08:00:00Z or "
                         f"unix seconds, got {text!r}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=tz)
    return parsed.timestamp()


def parse_zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name.strip())
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"--tz: unknown time zone {name!r}; expected an IANA name like UTC "
                         "or Europe/Berlin") from None


@dataclass(frozen=True, slots=True)
class Range:
    """Evaluation instants ``start, start + step, ..., end`` (unix seconds, multiples of
    ``step``). Each instant stands for the ``step`` seconds ending at it."""

    start: int
    end: int
    step: int

    @property
    def points(self) -> int:
        return (self.end - self.start) // self.step + 1

    @property
    def hours(self) -> float:
        """Hours covered: one step per instant."""
        return self.points * self.step / 3600

    def timestamps(self) -> range:
        return range(self.start, self.end + 1, self.step)


def resolve_range(*, now: float, step: int, since: int | None, start: float | None,
                  end: float | None) -> Range:
    """The step-aligned range: ``--since`` back from now (or ``--end``), or ``--start``/``--end``.

    Instants are aligned to multiples of ``step`` (as Grafana does), so reruns evaluate the
    same instants and samples written every ``step`` are hit exactly.
    """
    if since is not None and start is not None:
        raise ValueError("--since and --start are mutually exclusive; give one of them")
    last = end if end is not None else now
    first = start if start is not None else last - (since if since is not None else 7 * 86400)
    aligned_end = int(last // step * step)
    aligned_start = int(-(-first // step) * step)
    if aligned_end < aligned_start:
        raise ValueError(f"--start/--end: the range must hold at least one --step; got "
                         f"{iso(first)} .. {iso(last)} with step {step}s")
    return Range(aligned_start, aligned_end, step)


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class WorkingHours:
    """Weekdays (0 = Monday) and a daily window [start, end) in local minutes of the day."""

    days: frozenset[int]
    start_minute: int  # 0..1439
    end_minute: int  # 1..1440 (24:00), > start_minute
    text: str

    @classmethod
    def parse(cls, text: str) -> WorkingHours:
        """``"Mon-Fri 08:00-18:00"``, ``"Mon,Wed,Fri 09:00-17:30"``, ``"Sun-Thu 07:00-15:00"``
        (day ranges wrap around the week); the end may be ``24:00``. Windows that cross
        midnight are not supported: give two days' windows as separate reports instead."""
        expected = '--working-hours: expected "<days> <HH:MM>-<HH:MM>" like "Mon-Fri 08:00-18:00"'
        match = _HOURS_RE.match(text)
        if match is None:
            raise ValueError(f"{expected}, got {text!r}")
        days: set[int] = set()
        for part in match.group(1).split(","):
            names = part.split("-")
            if len(names) > 2 or not all(names):
                raise ValueError(f"{expected}; bad day range {part!r} in {text!r}")
            first, last = _day(names[0]), _day(names[-1])
            days.update((first + i) % 7 for i in range((last - first) % 7 + 1))
        start = _minute(match.group(2), match.group(3), text)
        end = _minute(match.group(4), match.group(5), text)
        if start >= 1440 or end <= start:
            raise ValueError(f"--working-hours: the end {match.group(4)}:{match.group(5)} must "
                             f"be after the start {match.group(2)}:{match.group(3)} on the "
                             f"same day, in {text!r}")
        return cls(frozenset(days), start, end, " ".join(text.split()))

    def contains(self, local: datetime) -> bool:
        """Whether a local (zone-aware) time is inside working hours."""
        minute = local.hour * 60 + local.minute
        return local.weekday() in self.days and self.start_minute <= minute < self.end_minute

    def mask(self, rng: Range, tz: ZoneInfo) -> bytearray:
        """1 for each instant of ``rng`` inside working hours (local time in ``tz``), else 0."""
        return bytearray(self.contains(datetime.fromtimestamp(ts, tz))
                         for ts in rng.timestamps())


def _day(name: str) -> int:
    key = name.strip().title()
    for i, short in enumerate(DAYS):
        if key in (short, _LONG_DAYS[i]):
            return i
    raise ValueError(f"--working-hours: unknown day {name!r}; expected one of {', '.join(DAYS)}")


_LONG_DAYS: Final = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday",
                     "Sunday")


def _minute(hour: str, minute: str, text: str) -> int:
    h, m = int(hour), int(minute)
    if not (0 <= h <= 24 and 0 <= m <= 59) or (h == 24 and m):
        raise ValueError(f"--working-hours: {hour}:{minute} is not a time of day "
                         f"(00:00-24:00), in {text!r}")
    return h * 60 + m

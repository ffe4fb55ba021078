"""Filters, the streaming summary, newest-first selection and uid lookup.

Memory is bounded by what the answer needs, never by the input size:

* :class:`Summary` keeps counters keyed by namespace, user, rule, workload class and day,
  so it grows with the number of *distinct* keys (namespaces, users, days) only.
* :func:`newest` keeps a heap of at most ``limit`` entries (``limit=0`` means "all matching
  entries", which then does hold every match in memory; the CLI documents that).
* :func:`find_uid` keeps at most ``MAX_UID_MATCHES`` matching entries.
"""

from __future__ import annotations

import heapq
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from itertools import count
from typing import Any, Final, TypeVar

from gpu_admission.auditlog.entry import Entry

DECISIONS: Final = ("allowed", "denied", "mutated", "failed-open")
MODES: Final = ("enforce", "warn", "audit")
MAX_UID_MATCHES: Final = 100
_K = TypeVar("_K", str, date)

_RELATIVE = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")
_UNITS: Final = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_when(text: str, now: datetime | None = None) -> datetime:
    """``--since``/``--until``: RFC 3339 (``2026-12-01T10:00:00Z``), a date (``2026-12-01``,
    midnight UTC) or an age relative to now (``30m``, ``24h``, ``7d``, ``2w``)."""
    relative = _RELATIVE.match(text)
    if relative:
        amount, unit = int(relative.group(1)), relative.group(2)
        return (now or datetime.now(UTC)) - timedelta(**{_UNITS[unit]: amount})
    try:
        parsed = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is neither RFC 3339 (2026-12-01T10:00:00Z), a date "
                         "(2026-12-01) nor a relative age (30m, 24h, 7d, 2w)") from None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).astimezone(UTC)


@dataclass(frozen=True, slots=True)
class Filter:
    """Which decisions to keep. Empty sets mean "any"."""

    since: datetime | None = None
    until: datetime | None = None
    namespaces: frozenset[str] = frozenset()
    rules: frozenset[str] = frozenset()
    decisions: frozenset[str] = frozenset()
    modes: frozenset[str] = frozenset()

    def match(self, entry: Entry) -> bool:
        record = entry.record
        if self.since is not None and entry.time < self.since:
            return False
        if self.until is not None and entry.time >= self.until:
            return False
        if self.namespaces and record.get("namespace") not in self.namespaces:
            return False
        if self.decisions and not any(_is(record, d) for d in self.decisions):
            return False
        if self.rules or self.modes:
            # A violation must satisfy both (--rule X --mode audit: X broken in audit mode).
            return any((not self.rules or v.get("rule") in self.rules)
                       and (not self.modes or v.get("mode") in self.modes)
                       for v in record.get("violations") or ())
        return True

    def describe(self) -> str:
        parts = []
        if self.since:
            parts.append(f"since {self.since:%Y-%m-%d %H:%M}Z")
        if self.until:
            parts.append(f"until {self.until:%Y-%m-%d %H:%M}Z")
        for name, values in (("namespace", self.namespaces), ("rule", self.rules),
                             ("decision", self.decisions), ("mode", self.modes)):
            if values:
                parts.append(f"{name} in {{{', '.join(sorted(values))}}}")
        return "; ".join(parts) or "all decisions"


def _is(record: Mapping[str, Any], decision: str) -> bool:
    if decision == "mutated":
        return record.get("mutated") is True
    return record.get("decision") == decision


@dataclass(slots=True)
class Tally:
    """Counts for one key of one dimension."""

    total: int = 0
    denied: int = 0
    mutated: int = 0
    warned: int = 0  # has a violation in warn mode
    audited: int = 0  # has a violation in audit mode

    def as_dict(self) -> dict[str, int]:
        return {"total": self.total, "denied": self.denied, "mutated": self.mutated,
                "warned": self.warned, "audited": self.audited}


DIMENSIONS: Final = ("decision", "namespace", "workload", "user", "rule")


@dataclass(slots=True)
class Summary:
    """Counters over a stream of decisions (constant memory per distinct key)."""

    total: int = 0
    dry_run: int = 0
    first: datetime | None = None
    last: datetime | None = None
    by: dict[str, dict[str, Tally]] = field(
        default_factory=lambda: {d: {} for d in DIMENSIONS})
    by_rule_mode: Counter[tuple[str, str]] = field(default_factory=Counter)
    per_day: dict[date, Tally] = field(default_factory=dict)
    denied_day_ns: Counter[tuple[date, str]] = field(default_factory=Counter)
    mutated_day_ns: Counter[tuple[date, str]] = field(default_factory=Counter)

    def add(self, entry: Entry) -> None:
        """Count one decision (the hot loop of every command: kept lean on purpose)."""
        record = entry.record
        when = entry.time
        self.total += 1
        if record.get("dryRun") is True:
            self.dry_run += 1
        if self.first is None or when < self.first:
            self.first = when
        if self.last is None or when > self.last:
            self.last = when
        decision = str(record.get("decision"))
        denied = decision == "denied"
        mutated = record.get("mutated") is True
        warned = audited = False
        rules: set[str] = set()
        for v in record.get("violations") or ():
            if isinstance(v, Mapping):
                rule, mode = str(v.get("rule")), str(v.get("mode"))
                warned = warned or mode == "warn"
                audited = audited or mode == "audit"
                rules.add(rule)
                self.by_rule_mode[(rule, mode)] += 1
        flags = (denied, mutated, warned, audited)
        namespace = str(record.get("namespace") or "(none)")
        by = self.by
        _count(by["decision"], decision, flags)
        _count(by["namespace"], namespace, flags)
        _count(by["workload"], str(record.get("workload") or "(none)"), flags)
        _count(by["user"], str(record.get("user") or "(unknown)"), flags)
        for rule in rules:
            _count(by["rule"], rule, flags)
        day = when.date()
        _count(self.per_day, day, flags)
        if denied:
            self.denied_day_ns[(day, namespace)] += 1
        if mutated:
            self.mutated_day_ns[(day, namespace)] += 1

    def rows(self, dimension: str, top: int = 0) -> list[tuple[str, Tally]]:
        """Keys of a dimension, most frequent first (ties by name); ``top=0``: all."""
        ordered = sorted(self.by[dimension].items(), key=lambda kv: (-kv[1].total, kv[0]))
        return ordered[:top] if top else ordered

    def as_dict(self, top: int = 0) -> dict[str, Any]:
        return {
            "total": self.total,
            "dryRun": self.dry_run,
            "first": _iso(self.first),
            "last": _iso(self.last),
            **{f"by{d.capitalize()}": {k: t.as_dict() for k, t in self.rows(d, top)}
               for d in DIMENSIONS},
            "byRuleMode": [{"rule": r, "mode": m, "count": n}
                           for (r, m), n in sorted(self.by_rule_mode.items(),
                                                   key=lambda kv: (-kv[1], kv[0]))],
            "perDay": {d.isoformat(): t.as_dict() for d, t in sorted(self.per_day.items())},
        }


def _count(table: dict[_K, Tally], key: _K, flags: tuple[bool, bool, bool, bool]) -> None:
    tally = table.get(key)
    if tally is None:
        tally = table[key] = Tally()
    tally.total += 1
    denied, mutated, warned, audited = flags
    tally.denied += denied
    tally.mutated += mutated
    tally.warned += warned
    tally.audited += audited


def _iso(when: datetime | None) -> str | None:
    return None if when is None else when.isoformat().replace("+00:00", "Z")


def newest(entries: Iterable[Entry], limit: int) -> list[Entry]:
    """The ``limit`` newest entries, newest first (``limit <= 0``: all, in memory)."""
    tie = count()  # stable order for equal times: later input wins
    if limit <= 0:
        everything = [(e.time, next(tie), e) for e in entries]
        everything.sort(reverse=True, key=lambda item: (item[0], item[1]))
        return [e for _, _, e in everything]
    heap: list[tuple[datetime, int, Entry]] = []
    for entry in entries:
        item = (entry.time, next(tie), entry)
        if len(heap) < limit:
            heapq.heappush(heap, item)
        elif item[:2] > heap[0][:2]:
            heapq.heapreplace(heap, item)
    return [e for _, _, e in sorted(heap, key=lambda item: (item[0], item[1]), reverse=True)]


def find_uid(entries: Iterable[Entry], uid: str) -> list[Entry]:
    """Entries whose uid equals ``uid`` or starts with it (like a short git hash)."""
    found: list[Entry] = []
    for entry in entries:
        if str(entry.record.get("uid", "")).startswith(uid):
            found.append(entry)
            if len(found) >= MAX_UID_MATCHES:
                break
    return found

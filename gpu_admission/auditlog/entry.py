"""What reading a decision log or audit log yields, apart from the reading: one decision with
where it came from (:class:`Entry`), an unusable line (:class:`BadLine`) and the read's
counters (:class:`ReadStats`). Pure value types, so queries and reports
(:mod:`.query`, :mod:`.report`) import no file reader (:mod:`.reader` fills them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

BAD_SAMPLES: Final = 20  # bad lines kept with their location; the rest are only counted


@dataclass(frozen=True, slots=True)
class BadLine:
    """A line that could not be used, and why."""

    source: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.reason}"


@dataclass(slots=True)
class ReadStats:
    """Counters kept while reading (constant size: only ``BAD_SAMPLES`` lines are kept)."""

    files: int = 0
    lines: int = 0
    records: int = 0  # decisions produced (an Event can give 0..n)
    events_skipped: int = 0  # audit Events without annotations of our webhooks
    log_lines: int = 0  # the server's own JSON log lines met in a mixed stream (not bad)
    bad: int = 0
    bad_samples: list[BadLine] = field(default_factory=list)

    def add_bad(self, source: str, line: int, reason: str) -> BadLine:
        self.bad += 1
        bad = BadLine(source, line, reason)
        if len(self.bad_samples) < BAD_SAMPLES:
            self.bad_samples.append(bad)
        return bad

    def as_dict(self) -> dict[str, Any]:
        return {"files": self.files, "lines": self.lines, "records": self.records,
                "eventsSkipped": self.events_skipped, "logLines": self.log_lines,
                "badLines": self.bad,
                "badSamples": [str(b) for b in self.bad_samples]}


@dataclass(frozen=True, slots=True)
class Entry:
    """One decision, with where it came from."""

    time: datetime
    record: dict[str, Any]
    source: str
    line: int

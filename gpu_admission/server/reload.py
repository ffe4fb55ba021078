"""Poll files for replacement and run a callback when they change.

Kubernetes updates a mounted Secret or ConfigMap by writing a new timestamped directory and
atomically re-pointing the ``..data`` symlink (kubelet ``atomic_writer.go``), so inotify on the
visible path does not see it; comparing ``(st_ino, st_mtime_ns, st_size)`` of the *resolved*
files every second does, and also catches plain file rewrites and renames. ``stat`` runs in a
thread so a slow volume never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from structlog.typing import FilteringBoundLogger

Signature = tuple[tuple[int, int, int], ...] | None


def file_signature(paths: Sequence[Path]) -> Signature:
    """Identity of the files the paths resolve to; None when any is missing."""
    out: list[tuple[int, int, int]] = []
    for path in paths:
        try:
            st = path.stat()  # follows symlinks: the ..data swap changes the inode
        except OSError:
            return None
        out.append((st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(out)


async def cancel_tasks(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel background tasks (watchers, pollers) and wait for each to finish, then forget
    them: used by the servers' cleanup contexts on shutdown."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    tasks.clear()


class FileWatcher:
    """Calls ``on_change`` (in the event loop) whenever the files' signature changes.

    A signature is acted on once: if loading fails (say, only the certificate was replaced
    yet), the next change (the key arriving) triggers another attempt, and a broken file does
    not flood the log every second.
    """

    def __init__(self, name: str, paths: Sequence[Path], interval: float,
                 on_change: Callable[[], Awaitable[object]], log: FilteringBoundLogger) -> None:
        self.name = name
        self.paths = tuple(paths)
        self.interval = interval
        self.on_change = on_change
        self.log = log
        self.last: Signature = file_signature(self.paths)

    async def check(self) -> bool:
        """Look once; True when a change was seen and ``on_change`` ran."""
        sig = await asyncio.to_thread(file_signature, self.paths)
        if sig is None or sig == self.last:
            return False  # missing mid-swap: keep what we have, look again later
        self.last = sig
        try:
            await self.on_change()
        except Exception:  # a reload must never kill the watcher
            self.log.exception("reload_failed", watcher=self.name)
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            with contextlib.suppress(OSError):
                await self.check()

"""A progress bar on stderr, redrawn in place at most ten times a second; safe across threads.

Small on purpose: one line, no dependency (tqdm would be a runtime dependency of the package for
this alone). Off when the stream is not a terminal, unless asked for.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

WIDTH = 30  # characters of the bar itself
REDRAW = 0.1  # seconds between redraws


class Progress:
    def __init__(self, total: int, label: str, unit: str = "turns", enabled: bool | None = None,
                 stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.total, self.label, self.unit = max(1, total), label, unit
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.done, self.started, self.drawn = 0, time.monotonic(), 0.0
        self._lock = threading.Lock()

    def update(self, count: int = 1) -> None:
        with self._lock:
            self.done += count
            now = time.monotonic()
            if self.enabled and (now - self.drawn >= REDRAW or self.done >= self.total):
                self.drawn = now
                self.stream.write("\r" + self.line(now))
                self.stream.flush()

    def line(self, now: float) -> str:
        fraction = min(1.0, self.done / self.total)
        elapsed = now - self.started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        left = (self.total - self.done) / rate if rate > 0 else 0.0
        filled = int(fraction * WIDTH)
        return (f"{self.label} [{'#' * filled}{'.' * (WIDTH - filled)}] {self.done}/{self.total} {self.unit} "
                f"{fraction:4.0%}  {rate:,.1f}/s  {'eta' if self.done < self.total else 'took'} "
                f"{_clock(left if self.done < self.total else elapsed)}")

    def close(self) -> None:
        if self.enabled:
            with self._lock:
                self.stream.write("\r" + self.line(time.monotonic()) + "\n")
                self.stream.flush()


def _clock(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{seconds:02d}" if minutes >= 60 else f"{minutes}:{seconds:02d}"

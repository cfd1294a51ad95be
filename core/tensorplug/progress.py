"""Progress of a long job, on stderr, whether or not anyone watches a terminal.

On a terminal it is rich's transient bar (when rich, an optional dependency, is
installed). When stderr is a pipe or a file (CI logs,
``tensorplug check | tee``), a bar would be silent, and a silent 40-second command
looks hung; so there it is one line every few seconds, and a last line saying how long
the job took: the first after a second, then one every few seconds. Jobs that end
within a second print nothing at all.
"""

from __future__ import annotations

import contextlib
import sys
import time
from types import TracebackType
from typing import Any, TextIO

from .extras import available

__all__ = ["Progress"]


class Progress:
    """``with Progress("checking OpenCL0", total=618) as p: ... p.advance()``."""

    def __init__(
        self,
        label: str,
        total: int,
        *,
        stream: TextIO | None = None,
        interval: float = 5.0,
        quiet_for: float = 1.0,
        unit: str = "",
    ) -> None:
        self.label, self.total, self.unit = label, max(total, 0), unit
        self.stream = stream if stream is not None else sys.stderr
        self.interval, self.quiet_for = interval, quiet_for
        self.done = 0
        self._start = self._last = 0.0
        self._printed = False
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        self._start = self._last = time.perf_counter()
        if _is_terminal(self.stream) and available("rich"):  # else the lines, as in a pipe
            from rich.console import Console
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(console=Console(file=self.stream), transient=True)
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=self.total or None)
        return self

    def advance(self, n: int = 1, label: str | None = None) -> None:
        self.update(self.done + n, label=label)

    def update(self, done: int, total: int | None = None, label: str | None = None) -> None:
        """Set the count (and the total or label, for a job of several stages)."""
        self.done = done
        if total is not None:
            self.total = total
        if label is not None:
            self.label = label
        if self._bar is not None:
            self._bar.update(
                self._task, completed=done, total=self.total or None, description=self.label
            )
            return
        now = time.perf_counter()
        due = not self._printed or now - self._last >= self.interval
        if due and now - self._start >= self.quiet_for:
            self._last = now
            self._line(f"{self._count()}, {now - self._start:.0f} s")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._bar is not None:
            self._bar.stop()
            return
        if self._printed and exc_type is None:
            self._line(f"done, {self._count()} in {time.perf_counter() - self._start:.1f} s")

    def _count(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        if not self.total:
            return f"{self.done}{unit}"
        return f"{self.done}/{self.total}{unit} ({100 * self.done // self.total}%)"

    def _line(self, text: str) -> None:
        self._printed = True
        # the reader went away (or closed the stream): progress is optional
        with contextlib.suppress(BrokenPipeError, ValueError):
            print(f"{self.label}: {text}", file=self.stream, flush=True)


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())

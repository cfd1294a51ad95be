"""How many CPU threads generation steps get, chosen by timing the steps themselves.

Which count is fastest depends on what else the machine runs, and on how a backend's
threads share work. A parallel kernel whose threads each own a fixed share ends when the
last of them has run: with busy processes beside it on a machine of few cores, numba's
OpenMP layer lost most of a step's idle speed on two threads, and less on one. A layer
whose calling thread takes the work of a descheduled one (numba's TBB, which the CPU
backend uses) kept nearly all of it on two threads, and lost a part of it on one
(``plugins/cpu/README.md``). Nothing outside the loop can tell which holds: load
averages lag by a minute and do not say whose load it is. So the loop measures. It times
its steps at the current thread count, now and then runs a few at a neighbouring count,
and keeps the faster. An exploration that loses doubles the wait before the next one,
so on a steady machine its cost fades; one that wins resets the wait, so the next change
of load is followed within tens of tokens.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from tensorplug.errors import InvalidArgumentError

__all__ = ["ThreadGovernor", "thread_counts"]


def thread_counts(max_threads: int) -> list[int]:
    """The counts a governor moves between: ``max_threads`` halved down to 1."""
    counts = [max(1, max_threads)]
    while counts[-1] > 1:
        counts.append(counts[-1] // 2)
    return counts


class ThreadGovernor:
    """Picks the thread count of single-token steps from their measured times.

    ``apply(n)`` sets the count (every backend with ggml's ``set_n_threads``). After
    each step the runner reports its wall time to :meth:`step_done`.

    - The first ``settle`` steps after any change are not counted: the first step at a
      new count pays for waking threads.
    - A count's speed is the median of ``window`` steps.
    - A neighbouring count replaces the current one when its median is at least
      ``margin`` faster.
    - A trial is decided at its first step that is ``abandon`` times slower or faster
      than the current median. On a busy machine a step on more threads can be many
      times slower, and one such step says enough.
    """

    def __init__(
        self,
        apply: Callable[[int], None],
        max_threads: int,
        *,
        window: int = 3,
        settle: int = 1,
        first_wait: int = 16,
        max_wait: int = 512,
        margin: float = 0.1,
        abandon: float = 2.0,
    ) -> None:
        # each written so that NaN fails it (NaN < 0 is False: margin=nan was accepted,
        # and every comparison of a step's time against it then said "no faster")
        wrong = [
            rule for rule, holds in (
                (f"window >= 1 (got {window})", window >= 1),
                (f"settle >= 0 (got {settle})", settle >= 0),
                (f"first_wait >= window (got {first_wait})", first_wait >= window),
                (f"max_wait >= first_wait (got {max_wait})", max_wait >= first_wait),
                (f"margin a finite number >= 0 (got {margin})", 0 <= margin < math.inf),
                (f"abandon > 1 (got {abandon})", abandon > 1),
            ) if not holds
        ]  # fmt: skip
        if wrong:
            raise InvalidArgumentError(f"ThreadGovernor: need {'; '.join(wrong)}")
        self.counts = thread_counts(max_threads)
        self.current = self.counts[0]
        self.window, self.settle, self.margin, self.abandon = window, settle, margin, abandon
        self.first_wait, self.max_wait = first_wait, max_wait
        self.explorations = 0
        self.switches = 0
        self._apply = apply
        self._times: list[float] = []  # the latest steps at ``current``
        self._trial: int | None = None  # the count being tried, if any
        self._trial_times: list[float] = []
        self._skip = settle
        self._skip_seconds = 0.0
        self._wait = first_wait
        self._until_trial = window  # the first trial comes early: load is there from the start
        self._down = False  # between two neighbours, trials alternate, fewer first
        self.applied = self.current  # the count of the next step
        apply(self.current)

    def step_done(self, seconds: float) -> None:
        """Account for one step that took ``seconds``; may change the thread count."""
        if self._skip > 0 or self._skip_seconds > 0:
            self._skip -= 1
            self._skip_seconds -= seconds
            return
        if self._trial is not None:
            self._trial_times.append(seconds)
            now = statistics.median(self._times)
            if len(self._trial_times) >= self.window or not (
                now / self.abandon <= seconds <= now * self.abandon
            ):  # enough steps, or one step that says enough
                self._decide()
            return
        self._times = [*self._times, seconds][-self.window :]
        self._until_trial -= 1
        if self._until_trial <= 0 and len(self._times) >= self.window and len(self.counts) > 1:
            self._begin_trial()

    def pause(self, seconds: float) -> None:
        """Count none of the steps of the next ``seconds`` (at least one), and drop the
        times gathered so far.

        The runner calls this after a prompt batch, whose after-effects would otherwise
        be blamed on the thread count: the first step switches graphs, and a library
        that threads large products itself may leave its workers spinning for a while
        (OpenBLAS does; a parallel kernel started then waits for the cores they hold, so
        on a machine of few cores the steps of that window run several times slower).
        tensorplug's CPU backend keeps BLAS on one thread for that reason, but another
        backend may not. The pause is measured in time, not steps, because that is how
        spinning ends.
        """
        if self._trial is not None:  # a trial cut by a prompt is dropped, to be run again
            self._trial = None
            self._set(self.current)
            self._until_trial = self.window
        self._skip = max(self._skip, 1)
        self._skip_seconds = max(self._skip_seconds, seconds)
        self._times = []
        self._trial_times = []

    def _neighbour(self) -> int:
        """The count to try next: the only neighbour, else fewer and more in turn."""
        i = self.counts.index(self.current)
        fewer = self.counts[i + 1] if i + 1 < len(self.counts) else None
        more = self.counts[i - 1] if i > 0 else None
        if fewer is None or more is None:
            found = fewer if more is None else more
            assert found is not None  # a governor with one count never tries another
            return found
        self._down = not self._down
        return fewer if self._down else more

    def _set(self, n: int) -> None:
        self.applied = n
        self._apply(n)

    def _begin_trial(self) -> None:
        self._trial = self._neighbour()
        self._trial_times = []
        self.explorations += 1
        self._set(self._trial)
        self._skip = self.settle

    def _decide(self) -> None:
        assert self._trial is not None
        now, tried = statistics.median(self._times), statistics.median(self._trial_times)
        if tried < now * (1 - self.margin):
            self.current, self._times = self._trial, self._trial_times
            self.switches += 1
            self._wait = self.first_wait
        else:
            self._set(self.current)
            self._skip = self.settle
            self._times = []
            self._wait = min(2 * self._wait, self.max_wait)
        self._trial = None
        self._trial_times = []
        self._until_trial = self._wait

"""Progress of a long step, logged: the one mechanism of prediction, scoring and embedding.

`Progress` logs its stage when the step starts, a line at least every `every_s` seconds while it
runs (from a thread, so the work itself is untouched) and one when it ends. With a `total`, a
line says how many of the step's units are done, the share, the rate and the ETA (units left at
the mean time per unit so far); without one (a compiled program reports nothing while it runs),
the seconds so far. `update` counts units as they finish, and `items` within them (images in an
embedding job's files), whose rate the lines report.
"""

import threading
import time
from types import TracebackType

from absl import logging

EVERY_S = 4.0  # a line at least every 5 s while a stage runs


class Progress:
    """A context manager logging a step's start, its heartbeat and its end (module docstring).

    Args:
      stage: what the step does, e.g. "scoring"; every line starts with it.
      detail: said once, in the first line.
      total: the units the step will finish (None: unknown, the heartbeat gives seconds).
      unit, items: the names of the units and of the items counted within them.
      every_s: the heartbeat's period (0: no heartbeat, a line per named unit only).
    """

    def __init__(
        self,
        stage: str,
        detail: str = "",
        *,
        total: int | None = None,
        unit: str = "",
        items: str = "",
        every_s: float = EVERY_S,
    ) -> None:
        self.stage, self.detail, self.total = stage, detail, total
        self.unit, self.items_name, self.every_s = unit, items, every_s
        self.done, self.items = 0, 0
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._lock = threading.Lock()

    def __enter__(self) -> "Progress":
        logging.info("%s ...", f"{self.stage} {self.detail}" if self.detail else self.stage)
        self._t0 = time.monotonic()
        if self.every_s > 0:
            self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if kind is None:
            logging.info("%s: done in %.1f s", self.stage, self.elapsed())

    def update(self, units: int = 0, *, items: int = 0, name: str = "") -> None:
        """Counts `units` finished and `items` processed; with a `name` (the unit just
        finished, e.g. a shard's file), logs a line for it at once."""
        with self._lock:
            self.done += units
            self.items += items
            if name:
                logging.info("%s: %s done, %s", self.stage, name, self.status())

    def elapsed(self) -> float:
        """Seconds since the step started."""
        return time.monotonic() - self._t0

    def status(self) -> str:
        """Returns the heartbeat's text: units done of the total, share, rate and ETA, or the
        seconds so far without a total."""
        seconds = max(self.elapsed(), 1e-9)
        if self.total is None:
            return f"{seconds:.0f} s so far"
        share = 100.0 * self.done / max(self.total, 1)
        unit = f" {self.unit}" if self.unit else ""
        parts = [f"{self.done}/{self.total}{unit} ({share:.1f}%)"]
        if self.items_name:
            parts.append(f"{self.items / seconds:.1f} {self.items_name}/s")
        else:
            parts.append(f"{self.done / seconds:.1f}{unit}/s")
        if self.done:
            parts.append(f"ETA {(self.total - self.done) * seconds / self.done:.0f} s")
        return ", ".join(parts)

    def _beat(self) -> None:
        while not self._stop.wait(self.every_s):
            with self._lock:
                logging.info("%s: %s", self.stage, self.status())

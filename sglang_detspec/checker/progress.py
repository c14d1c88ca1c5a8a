"""A one-line progress bar on stderr (the checker must not need tqdm, which only SGLang's environment has)."""

from __future__ import annotations

from typing import TextIO


class ProgressBar:
    """``check [########..........] 12/54 mixed trial 3 (...)``, redrawn in place; cleared on exit.

    ``enabled`` None: only when ``stream`` is a terminal (a log file or a pipe gets no carriage returns).
    """

    WIDTH = 24

    def __init__(self, total: int, *, enabled: bool | None, stream: TextIO):
        self.total = max(1, total)
        self.done = 0
        self.stream = stream
        isatty = getattr(stream, "isatty", None)
        self.enabled = bool(isatty and isatty()) if enabled is None else enabled
        self._what = ""
        self._drawn = 0

    def __enter__(self) -> "ProgressBar":
        return self

    def __exit__(self, *exc) -> None:
        if self.enabled and self._drawn:
            self.stream.write("\r" + " " * self._drawn + "\r")
            self.stream.flush()

    def show(self, what: str) -> None:
        self._what = what
        self._draw()

    def advance(self, steps: int = 1) -> None:
        self.done = min(self.total, self.done + steps)
        self._draw()

    def _draw(self) -> None:
        if not self.enabled:
            return
        filled = self.WIDTH * self.done // self.total
        line = f"check [{'#' * filled}{'.' * (self.WIDTH - filled)}] {self.done}/{self.total} {self._what}"[:119]
        self.stream.write("\r" + line.ljust(self._drawn))
        self.stream.flush()
        self._drawn = len(line)

"""Progress of an execution on the console, one line per operator, as Ray Data shows: blocks
and rows out, with the elapsed time. Redrawn in place at most every 0.5 s on a terminal;
when stderr is not a terminal, one summary line per operator at the end of an execution that
took over ``QUIET_S`` (short ones stay quiet in logs). Executor thread only.
"""
from __future__ import annotations

import sys
import time

QUIET_S = 2.0


class Bars:
    def __init__(self, stages, enabled: bool):
        self.stages = stages
        self.tty = enabled and sys.stderr.isatty()
        self.enabled = enabled
        self.last = 0.0
        self.drawn = 0
        self.t0 = time.perf_counter()

    def _lines(self):
        return [f"- {s.name}: {s.blocks_out} blocks, {s.rows_out} rows"
                + (" (done)" if s.finished else "") for s in self.stages]

    def update(self) -> None:
        if not self.tty:
            return
        now = time.perf_counter()
        if now - self.last < 0.5:
            return
        self.last = now
        lines = self._lines()
        out = ("\x1b[F" * self.drawn) + "".join(f"\x1b[2K{l}\n" for l in lines)
        sys.stderr.write(out)
        sys.stderr.flush()
        self.drawn = len(lines)

    def close(self, wall_s: float) -> None:
        if not self.enabled:
            return
        if self.tty:
            self.last = 0.0
            self.update()
        elif wall_s < QUIET_S:
            return
        else:
            sys.stderr.write("".join(l + "\n" for l in self._lines()))
        sys.stderr.write(f"Dataset execution finished in {wall_s:.2f} seconds\n")
        sys.stderr.flush()

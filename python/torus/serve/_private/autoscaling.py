"""Autoscaling decisions for one deployment, from the ongoing requests its handles report.

Ray's policy: the desired count is `ceil(current * (1 + (per_replica / target - 1) * factor))`
(upscaling or downscaling factor), bounded by `min_replicas`/`max_replicas`; from zero replicas,
any waiting request asks for one (at least). A change takes effect only once it has been
wanted without a break for `upscale_delay_s` (up) or `downscale_delay_s` (down;
`downscale_to_zero_delay_s` for the last step to zero, when set).

Metrics: each handle (router) sends its ongoing requests (sent and waiting) every
`metrics_interval_s`; a handle's figure is the mean of its reports over `look_back_period_s`
(its last report when none is that recent), and reports older than twice the look-back period
are dropped (the handle's process is gone or idle).
Used by the controller's loop only: no locking.
"""
from __future__ import annotations

import collections
import math
import time
from typing import Deque, Dict, Optional, Tuple


class AutoscalingState:
    def __init__(self, config: dict):
        self.config = config
        self._reports: Dict[str, Deque[Tuple[float, float]]] = {}
        self._want: Optional[int] = None
        self._want_since = 0.0
        self.decisions = []

    def update_config(self, config: dict) -> None:
        self.config = config

    def record(self, handle_id: str, ongoing: float, now: Optional[float] = None) -> None:
        q = self._reports.setdefault(handle_id, collections.deque())
        q.append((now if now is not None else time.monotonic(), float(ongoing)))
        while len(q) > 1000:
            q.popleft()

    def total_ongoing(self, now: float) -> float:
        look = self.config["look_back_period_s"]
        total = 0.0
        for hid in list(self._reports):
            q = self._reports[hid]
            while q and now - q[0][0] > 2 * look and len(q) > 1:
                q.popleft()
            if not q or now - q[-1][0] > 2 * look:
                del self._reports[hid]
                continue
            recent = [v for t, v in q if now - t <= look]
            total += sum(recent) / len(recent) if recent else q[-1][1]
        return total

    def desired(self, current: int, now: float) -> int:
        c = self.config
        lo, hi = c["min_replicas"], c["max_replicas"]
        total = self.total_ongoing(now)
        target = c.get("target_ongoing_requests") or 2.0
        if current == 0:
            want = max(lo, 1 if total > 0 else 0)
            want = max(want, math.ceil(total / target)) if total > 0 else want
        else:
            ratio = (total / current) / target
            factor = (c.get("upscaling_factor") or c.get("upscale_smoothing_factor")
                      or c.get("smoothing_factor") or 1.0) if ratio > 1 else \
                (c.get("downscaling_factor") or c.get("downscale_smoothing_factor")
                 or c.get("smoothing_factor") or 1.0)
            want = math.ceil(current * (1 + (ratio - 1) * factor))
            if ratio < 1 and want >= current:  # a small factor still moves down by one
                want = current - 1 if total / target <= current - 1 else current
        return max(lo, min(hi, want))

    def decide(self, current: int, now: Optional[float] = None) -> int:
        """The replica count to have now (current, unless a change has waited long enough)."""
        now = time.monotonic() if now is None else now
        want = self.desired(current, now)
        if want == current:
            self._want = None
            return current
        if self._want is None or (want > current) != (self._want > current):
            self._want, self._want_since = want, now
        else:
            self._want = want
        c = self.config
        if want > current:
            delay = c["upscale_delay_s"] if current > 0 else 0.0
        elif want == 0 and c.get("downscale_to_zero_delay_s") is not None:
            delay = c["downscale_to_zero_delay_s"]
        else:
            delay = c["downscale_delay_s"]
        if now - self._want_since >= delay:
            self._want = None
            self.decisions.append({"timestamp_s": time.time(), "prev_num_replicas": current,
                                   "curr_num_replicas": want,
                                   "reason": f"ongoing requests {self.total_ongoing(now):.1f}"})
            del self.decisions[:-20]
            return want
        return current

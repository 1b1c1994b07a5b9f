"""The training controller: runs attempts of the worker group until the loop finishes on every
worker or the failure budget is spent (Ray Train v2's controller, here in the driver).

Each attempt reserves afresh, starts every worker from the run's latest complete checkpoint, and
records each report as it completes (state file, pruning, one progress line of rank 0's
metrics). A failure of any worker (its process or host lost, or the loop raising) stops the
whole group and releases the reservation; the next attempt resumes from the last checkpoint.

THREADS: the caller's (fit()).
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from torus.train._checkpoint import Checkpoint, RunState, checkpoint_dir
from torus.train._config import RunConfig, ScalingConfig
from torus.train._worker_group import WorkerGroup


class TrainingFailedError(Exception):
    """fit() gave up: the group failed more than FailureConfig.max_failures times. The first
    failure is ``__cause__`` and its message is part of this one's; ``worker_failures`` maps
    the failed rank of the last attempt to its error, ``failures`` lists every attempt's."""

    def __init__(self, message: str, worker_failures: Optional[Dict[int, BaseException]] = None,
                 failures: Optional[List[BaseException]] = None):
        super().__init__(message)
        self.worker_failures = worker_failures or {}
        self.failures = failures or []


class _NotRetryable(Exception):
    """A failure no restart can mend (the storage path is not shared, ...)."""


@dataclass
class Result:
    """What fit() returns (Ray Train's ``Result``)."""
    metrics: Optional[Dict[str, Any]]
    checkpoint: Optional[Checkpoint]
    path: str
    error: Optional[BaseException] = None
    best_checkpoints: List[Tuple[Checkpoint, Dict[str, Any]]] = field(default_factory=list)

    @property
    def filesystem(self):
        return None  # local or mounted paths only

    @classmethod
    def from_path(cls, path: str) -> "Result":
        st = RunState(os.path.abspath(os.path.expanduser(path)), read_only=True)
        return _result(st)

    def get_best_checkpoint(self, metric: str, mode: str = "max") -> Optional[Checkpoint]:
        scored = [(c, m[metric]) for c, m in self.best_checkpoints
                  if isinstance(m.get(metric), (int, float))]
        if not scored:
            return None
        pick = max if mode == "max" else min
        return pick(scored, key=lambda t: t[1])[0]


def _result(state: RunState) -> Result:
    # As Ray: the metrics reported with the latest checkpoint (None without one).
    latest = state.entries[-1]["metrics"] if state.entries else None
    return Result(latest, state.latest(), state.run_path, None, state.best())


def _fmt(metrics: Dict[str, Any]) -> str:
    def one(v):
        return f"{v:.6g}" if isinstance(v, float) else str(v)
    return ", ".join(f"{k}={one(v)}" for k, v in metrics.items())


def run_training(fn: Callable, config: Optional[dict], scaling: ScalingConfig, run: RunConfig,
                 default_name: str, initial_checkpoint: Optional[Checkpoint] = None,
                 datasets: Optional[Dict[str, Any]] = None, data_config: Any = None) -> Result:
    run_path = run.run_path(default_name)
    name = os.path.basename(run_path)
    cc = run.checkpoint_config
    state = RunState(run_path, cc.num_to_keep, cc.checkpoint_score_attribute,
                     cc.checkpoint_score_order)
    verbose = run.verbose

    def log(msg: str) -> None:
        if verbose:
            print(f"[torus.train {name}] {msg}", file=sys.stderr, flush=True)

    def on_report(index: int, metrics: Dict[str, Any], has_checkpoint: bool) -> None:
        state.record(index, metrics, has_checkpoint)
        if verbose:
            line = f"report {index}: {_fmt(metrics)}"
            if has_checkpoint:
                line += f"  (checkpoint: {checkpoint_dir(run_path, index)})"
            print(f"[torus.train {name}] {line}", flush=True)

    max_failures = run.failure_config.max_failures
    failures: List[BaseException] = []
    log(f"run directory {run_path}" + (f"; resuming from {state.latest().path}"
                                        if state.latest() else ""))
    fast_streak = 0  # attempts in a row that failed within 10 s
    while True:
        attempt = len(failures)
        if attempt:
            state.begin_attempt()
        latest = state.latest() or initial_checkpoint
        group = WorkerGroup(scaling, run, name, run_path, log, datasets, data_config)
        t0 = time.monotonic()
        failed: Optional[Tuple[int, BaseException]] = None
        try:
            group.start(attempt, state.next_index, latest.path if latest else None)
            log(f"{scaling.num_workers} worker(s) started in {time.monotonic() - t0:.1f} s"
                + (f", from checkpoint {latest.path}" if latest else ""))
            failed = group.run(fn, config, on_report)
        except (ValueError, _NotRetryable):
            raise  # a configuration no restart can satisfy
        except Exception as e:  # noqa: BLE001 - the group failed to start: a failed attempt
            failed = (-1, e)
        finally:
            group.shutdown(on_report)  # KeyboardInterrupt and SystemExit pass through it
        if failed is None:
            log("finished")
            return _result(state)
        failures.append(failed[1])
        if max_failures != -1 and len(failures) > max_failures:
            first = failures[0]
            raise TrainingFailedError(
                f"training {name} failed {len(failures)} time(s) (FailureConfig.max_failures="
                f"{max_failures}); the first failure: {type(first).__name__}: {first}",
                {failed[0]: failed[1]}, failures) from first
        err = failed[1]
        log(f"the worker group failed ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}); restart {len(failures)}"
            + (f" of {max_failures}" if max_failures != -1 else "")
            + (f" from {state.latest().path}" if state.latest() else " from the start"))
        # An attempt that fails within seconds again and again (a loop that raises at once, a
        # bad runtime env) waits before the next: 1, 2, 4 ... 30 s, reset by a longer run.
        fast_streak = fast_streak + 1 if time.monotonic() - t0 < 10 else 0
        if fast_streak > 1:
            time.sleep(min(30.0, 2.0 ** (fast_streak - 2)))

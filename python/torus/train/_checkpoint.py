"""Checkpoints (Ray Train's ``Checkpoint``) and the run directory that keeps them.

Layout of a run directory (``<storage_path>/<name>``):
  checkpoint_000003/      one per reported checkpoint, numbered by report (every rank's files)
  torus_train_state.json  the kept checkpoints with the metrics reported with them, in order
  trainer.pkl             the trainer's arguments, for JaxTrainer.restore

The state file is replaced atomically (write, fsync, rename) after a checkpoint is complete, so
a run killed at any moment resumes from the last complete checkpoint; a directory that is not
in the state file (a checkpoint some ranks never finished) is deleted on the next start.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from typing import Any, Dict, Iterator, List, Optional, Tuple

STATE_FILE = "torus_train_state.json"


class Checkpoint:
    """A directory of files (Ray's ``ray.train.Checkpoint``)."""

    def __init__(self, path: str):
        self.path = os.fspath(path)

    @classmethod
    def from_directory(cls, path: str) -> "Checkpoint":
        if not os.path.isdir(path):
            raise ValueError(f"Checkpoint.from_directory: {path!r} is not a directory")
        return cls(os.path.abspath(path))

    def to_directory(self, path: Optional[str] = None) -> str:
        dest = path or tempfile.mkdtemp(prefix="checkpoint-")
        shutil.copytree(self.path, dest, dirs_exist_ok=True)
        return dest

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        yield self.path

    def get_metadata(self) -> Dict[str, Any]:
        p = os.path.join(self.path, ".metadata.json")
        return json.load(open(p)) if os.path.exists(p) else {}

    def set_metadata(self, metadata: Dict[str, Any]) -> None:
        with open(os.path.join(self.path, ".metadata.json"), "w") as f:
            json.dump(metadata, f)

    def __repr__(self) -> str:
        return f"Checkpoint(path={self.path!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Checkpoint) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)


def checkpoint_dir(run_path: str, index: int) -> str:
    return os.path.join(run_path, f"checkpoint_{index:06d}")


class RunState:
    """The kept checkpoints of a run and their metrics (driver side only)."""

    def __init__(self, run_path: str, num_to_keep: Optional[int] = None,
                 score_attribute: Optional[str] = None, score_order: str = "max",
                 read_only: bool = False):
        self.run_path = run_path
        self.num_to_keep = num_to_keep
        self.score_attribute = score_attribute
        self.score_order = score_order
        self.entries: List[Dict[str, Any]] = []   # {"index", "dir", "metrics"} in report order
        self.next_index = 0
        self.latest_metrics: Optional[Dict[str, Any]] = None
        if read_only:
            if not os.path.isdir(run_path):
                raise RuntimeError(f"no training run at {run_path}")
        else:
            os.makedirs(run_path, exist_ok=True)
        self._load()
        if not read_only:
            self.begin_attempt()

    def _load(self) -> None:
        p = os.path.join(self.run_path, STATE_FILE)
        if os.path.exists(p):
            with open(p) as f:
                s = json.load(f)
            self.entries = [e for e in s.get("checkpoints", [])
                            if os.path.isdir(os.path.join(self.run_path, e["dir"]))]
            self.next_index = int(s.get("next_index", 0))
            self.latest_metrics = s.get("latest_metrics")

    def begin_attempt(self) -> None:
        """Before workers start: directories no complete report recorded (an attempt's ranks
        were copying when it failed) are deleted, and report numbers continue past every
        directory that existed, so no new checkpoint reuses an old one's directory."""
        kept = {e["dir"] for e in self.entries}
        highest = -1
        for name in os.listdir(self.run_path):
            if not name.startswith("checkpoint_"):
                continue
            try:
                highest = max(highest, int(name[len("checkpoint_"):]))
            except ValueError:
                pass
            if name not in kept:
                shutil.rmtree(os.path.join(self.run_path, name), ignore_errors=True)
        self.next_index = max([self.next_index, highest + 1] +
                              [e["index"] + 1 for e in self.entries])

    def _save(self) -> None:
        p = os.path.join(self.run_path, STATE_FILE)
        tmp = p + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"checkpoints": self.entries, "next_index": self.next_index,
                       "latest_metrics": self.latest_metrics}, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)

    def latest(self) -> Optional[Checkpoint]:
        if not self.entries:
            return None
        return Checkpoint(os.path.join(self.run_path, self.entries[-1]["dir"]))

    def record(self, index: int, metrics: Dict[str, Any], has_checkpoint: bool) -> List[str]:
        """A report every rank made; returns the checkpoint directories pruned by it."""
        self.next_index = max(self.next_index, index + 1)
        self.latest_metrics = metrics
        pruned: List[str] = []
        if has_checkpoint:
            self.entries.append({"index": index, "dir": os.path.basename(
                checkpoint_dir(self.run_path, index)), "metrics": metrics})
            pruned = self._prune()
        self._save()
        for d in pruned:
            shutil.rmtree(os.path.join(self.run_path, d), ignore_errors=True)
        return pruned

    def _prune(self) -> List[str]:
        if self.num_to_keep is None or len(self.entries) <= self.num_to_keep:
            return []
        latest = self.entries[-1]
        if self.score_attribute:
            sign = 1 if self.score_order == "max" else -1

            def score(e):
                v = e["metrics"].get(self.score_attribute)
                return sign * v if isinstance(v, (int, float)) else float("-inf")
            ranked = sorted(self.entries, key=score, reverse=True)
            keep = ranked[:self.num_to_keep]
            if latest not in keep:  # the latest stays too: it is what a restart resumes from
                keep = keep + [latest]
        else:
            keep = self.entries[-self.num_to_keep:]
        pruned = [e["dir"] for e in self.entries if e not in keep]
        self.entries = [e for e in self.entries if e in keep]
        return pruned

    def best(self) -> List[Tuple[Checkpoint, Dict[str, Any]]]:
        return [(Checkpoint(os.path.join(self.run_path, e["dir"])), e["metrics"])
                for e in self.entries]

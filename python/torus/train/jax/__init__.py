"""`torus.train.jax.JaxTrainer` (Ray Train v2's JaxTrainer): one worker per host of whole TPU
slices (or of an ordinary group), each running ``train_loop_per_worker`` (docs/train.md)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

import cloudpickle

from torus.train._checkpoint import Checkpoint
from torus.train._config import RunConfig, ScalingConfig
from torus.train._controller import Result, run_training

_TRAINER_FILE = "trainer.pkl"


@dataclass
class JaxConfig:
    """Ray's JaxConfig; ``use_tpu`` follows ScalingConfig.use_tpu when not given."""
    use_tpu: bool = False
    use_gpu: bool = False


class JaxTrainer:
    def __init__(self, train_loop_per_worker: Callable, *, train_loop_config: Optional[Dict] = None,
                 jax_config: Optional[JaxConfig] = None,
                 scaling_config: Optional[ScalingConfig] = None,
                 run_config: Optional[RunConfig] = None, datasets: Optional[Dict] = None,
                 dataset_config: Any = None, resume_from_checkpoint: Optional[Checkpoint] = None,
                 metadata: Optional[Dict] = None):
        if not callable(train_loop_per_worker):
            raise TypeError("JaxTrainer: train_loop_per_worker must be a function")
        from torus.train._worker_group import required_parameters
        if required_parameters(train_loop_per_worker) > 1:
            raise ValueError(f"train_loop_per_worker should take in 0 or 1 required arguments, "
                             f"but it accepts {required_parameters(train_loop_per_worker)}")
        if datasets is not None and not isinstance(datasets, dict):
            raise TypeError(f"JaxTrainer: datasets must be a dict of name to Dataset, got "
                            f"{type(datasets).__name__}")
        self.datasets = dict(datasets or {})
        self.dataset_config = dataset_config
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = train_loop_config
        self.scaling_config = scaling_config or ScalingConfig()
        self.run_config = run_config or RunConfig()
        self.jax_config = jax_config or JaxConfig(use_tpu=self.scaling_config.use_tpu,
                                                  use_gpu=self.scaling_config.use_gpu)
        self.resume_from_checkpoint = resume_from_checkpoint
        self.metadata = metadata

    def _default_name(self) -> str:
        import time
        return time.strftime("JaxTrainer_%Y-%m-%d_%H-%M-%S")

    def fit(self) -> Result:
        """Trains to the end; raises TrainingFailedError when the failures exceed the budget."""
        from torus._private import worker
        worker.ensure_initialized()
        if self.run_config.name is None:  # one name for the run, kept for restore()
            self.run_config.name = self._default_name()
        path = self.run_config.run_path(self.run_config.name)
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, _TRAINER_FILE), "wb") as f:
            cloudpickle.dump({"train_loop_per_worker": self.train_loop_per_worker,
                              "train_loop_config": self.train_loop_config,
                              "scaling_config": self.scaling_config,
                              "run_config": self.run_config, "jax_config": self.jax_config}, f)
        return run_training(self.train_loop_per_worker, self.train_loop_config,
                            self.scaling_config, self.run_config, self.run_config.name,
                            self.resume_from_checkpoint, self.datasets, self.dataset_config)

    @classmethod
    def can_restore(cls, path: str) -> bool:
        return os.path.exists(os.path.join(os.path.expanduser(path), _TRAINER_FILE))

    @classmethod
    def restore(cls, path: str, **overrides) -> "JaxTrainer":
        """The trainer of the run at ``path``, to fit() again: it resumes from the run's latest
        checkpoint. Keyword arguments replace the saved ones (e.g. a train_loop_per_worker)."""
        path = os.path.abspath(os.path.expanduser(path))
        if not cls.can_restore(path):
            raise ValueError(f"JaxTrainer.restore: {path} holds no trainer ({_TRAINER_FILE})")
        with open(os.path.join(path, _TRAINER_FILE), "rb") as f:
            saved = cloudpickle.load(f)
        saved.update(overrides)
        rc = saved["run_config"]
        rc.storage_path, rc.name = os.path.dirname(path), os.path.basename(path)
        fn = saved.pop("train_loop_per_worker")
        return cls(fn, **saved)


__all__ = ["JaxTrainer", "JaxConfig"]

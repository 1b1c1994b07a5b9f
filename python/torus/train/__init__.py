"""`torus.train`: Ray Train's v2 API (Ray 2.60 names and semantics) for training on whole TPU
slices and ordinary worker groups (docs/train.md).

    from torus.train import ScalingConfig, RunConfig, CheckpointConfig, FailureConfig
    from torus.train.jax import JaxTrainer

    def loop(config):
        ctx = torus.train.get_context()            # world rank/size, local rank, node rank
        ckpt = torus.train.get_checkpoint()        # where a restart resumes from
        ...
        torus.train.report({"loss": loss}, checkpoint=Checkpoint.from_directory(d))

    result = JaxTrainer(loop, scaling_config=ScalingConfig(use_tpu=True, topology="4x4",
                        accelerator_type="TPU-V6E", num_workers=4), run_config=RunConfig(...)).fit()

Under `python -m torus.ray`, `ray.train` and `ray.train.jax` (and `ray.train.v2...`) are these.
"""
from torus.train._checkpoint import Checkpoint
from torus.train._config import (CheckpointConfig, DataConfig, FailureConfig, RunConfig,
                                 ScalingConfig)
from torus.train._controller import Result, TrainingFailedError
from torus.train._session import (TrainContext, get_checkpoint, get_context,
                                  get_dataset_shard, report)

__all__ = ["Checkpoint", "CheckpointConfig", "DataConfig", "FailureConfig", "RunConfig", "ScalingConfig",
           "Result", "TrainingFailedError", "TrainContext", "get_checkpoint", "get_context",
           "get_dataset_shard", "report"]

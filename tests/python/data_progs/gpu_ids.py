"""A map_batches UDF that asks for a GPU sees which one it was given (Ray Data docs "Working
with GPUs" / Ray Core "GPU support": ray.get_gpu_ids() lists the task's GPU and
CUDA_VISIBLE_DEVICES names it), with a GPU declared to ray.init (no physical GPU needed)."""
import os

import numpy as np

import ray


def gpu_ids(batch):
    ids = ray.get_gpu_ids()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return {"gpus": np.full(len(batch["id"]), len(ids)),
            "visible": np.array([visible] * len(batch["id"]))}


def main():
    ray.init(num_cpus=2, num_gpus=1)
    rows = ray.data.range(16, override_num_blocks=2).map_batches(
        gpu_ids, num_gpus=1, batch_size=8).take_all()
    assert len(rows) == 16, len(rows)
    assert {r["gpus"] for r in rows} == {1}, {r["gpus"] for r in rows}
    assert {r["visible"] for r in rows} == {"0"}, {r["visible"] for r in rows}
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()

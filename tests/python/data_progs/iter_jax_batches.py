"""iter_jax_batches (Ray Data API Dataset.iter_jax_batches / DataIterator.iter_jax_batches, Ray
2.60): batches come as dicts of global jax.Arrays sharded along the batch dimension over a 1-D
mesh of all the process's JAX devices (two CPU devices here); batch_size must be a multiple of
the local device count (ValueError otherwise); values and dtypes are the dataset's (or those
given with dtypes=); every row is seen once; drop_last drops the short last batch and paddings
fills it up to batch_size; it works on a dataset's iterator too."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import ray  # noqa: E402

N = 100


def main():
    ray.init(num_cpus=4)
    assert jax.local_device_count() == 2, jax.devices()
    ds = ray.data.range(N, override_num_blocks=4).map_batches(
        lambda b: {"id": b["id"], "x": (b["id"] * 0.5).astype(np.float32),
                   "v": np.stack([b["id"], -b["id"]], axis=1)})
    seen, sizes = [], []
    for batch in ds.iter_jax_batches(batch_size=8):
        assert set(batch) == {"id", "x", "v"}, batch.keys()
        ids = batch["id"]
        assert isinstance(ids, jax.Array), type(ids)
        assert len(ids.sharding.device_set) == 2, ids.sharding   # over both devices
        assert batch["x"].dtype == jnp.float32 and batch["v"].shape == (len(ids), 2)
        host = np.asarray(ids)
        assert np.allclose(np.asarray(batch["x"]), host * 0.5)
        assert (np.asarray(batch["v"])[:, 1] == -host).all()
        seen.extend(host.tolist())
        sizes.append(len(host))
    assert sorted(seen) == list(range(N)), sorted(seen)[:10]
    assert sizes[:-1] == [8] * (len(sizes) - 1) and sizes[-1] == N % 8, sizes

    dropped = [len(b["id"]) for b in ds.iter_jax_batches(batch_size=8, drop_last=True)]
    assert dropped == [8] * (N // 8), dropped
    padded = list(ds.iter_jax_batches(batch_size=8, paddings=-1))
    assert all(b["id"].shape == (8,) for b in padded)
    last = np.asarray(padded[-1]["id"])
    assert (last == -1).sum() == 8 - N % 8, last
    typed = next(iter(ds.iter_jax_batches(batch_size=4, dtypes={"id": jnp.int32,
                                                                "x": jnp.float32,
                                                                "v": jnp.int32})))
    assert typed["id"].dtype == jnp.int32, typed["id"].dtype
    try:
        next(iter(ds.iter_jax_batches(batch_size=7)))
    except ValueError as e:
        assert "7" in str(e), str(e)
    else:
        raise AssertionError("batch_size 7 over 2 devices did not fail")
    it_rows = sum(len(b["id"]) for b in ds.iterator().iter_jax_batches(batch_size=10))
    assert it_rows == N
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()

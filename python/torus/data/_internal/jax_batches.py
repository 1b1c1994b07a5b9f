"""iter_jax_batches: batches as global ``jax.Array``s sharded along the batch axis over a 1-D
mesh of every device of the (possibly multi-host) JAX program.

Each host contributes its local batch (``batch_size`` rows of its shard) and the global array
holds the batches of all hosts (``jax.make_array_from_process_local_data``). Every host must
yield the same number of batches per epoch or the collective assembling them waits forever:
shards from ``streaming_split(equal=True)`` (what Train gives each worker) have equal rows, so
every host's last batch is equally short (``drop_last=True`` drops it everywhere;
``paddings=v`` fills it up to ``batch_size`` with ``v``).
"""
from __future__ import annotations

from typing import Any, Dict, Iterator


def _default_sharding():
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    import numpy as np
    mesh = Mesh(np.array(jax.devices()), ("batch",))
    return NamedSharding(mesh, PartitionSpec("batch"))


def _pad(v, batch_size: int, paddings):
    import numpy as np
    if paddings is None or len(v) >= batch_size:
        return v
    fill = np.full((batch_size - len(v),) + v.shape[1:], paddings, dtype=v.dtype)
    return np.concatenate([v, fill])


def jax_batches(it, *, batch_size: int, drop_last: bool, prefetch_batches: int,
                local_shuffle_buffer_size, local_shuffle_seed, dtypes=None,
                sharding=None, paddings=None, collate_fn=None) -> Iterator[Dict[str, Any]]:
    import jax
    import numpy as np
    shard = sharding if sharding is not None else _default_sharding()
    local_devices = len(jax.local_devices())
    if batch_size % local_devices:
        raise ValueError(f"iter_jax_batches: batch_size {batch_size} must be a multiple of this "
                         f"host's {local_devices} JAX devices (the batch is split over them)")
    for batch in it.iter_batches(batch_size=batch_size, batch_format="numpy", drop_last=drop_last,
                                 prefetch_batches=prefetch_batches,
                                 local_shuffle_buffer_size=local_shuffle_buffer_size,
                                 local_shuffle_seed=local_shuffle_seed):
        if collate_fn is not None:
            batch = collate_fn(batch)
        out = {}
        for k, v in batch.items():
            pad = paddings.get(k) if isinstance(paddings, dict) else paddings
            v = _pad(v, batch_size, pad)
            if v.dtype == object:
                raise TypeError(f"iter_jax_batches: column {k!r} is not numeric ({v.dtype}); "
                                f"select or convert it first")
            want = dtypes.get(k) if isinstance(dtypes, dict) else dtypes
            if want is not None:
                v = v.astype(want)
            out[k] = jax.make_array_from_process_local_data(shard, np.ascontiguousarray(v))
        yield out

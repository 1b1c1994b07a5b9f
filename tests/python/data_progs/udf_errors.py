"""A UDF's exception reaches the driver (Ray Data docs "Transforming data"; Ray's
"Exceptions" API: a task's error is re-raised with the remote traceback): a ValueError raised
by a map_batches function, a map function, a callable class in an actor pool, or while the
driver iterates, makes the consuming call raise an exception (Ray 2.60: RayTaskError wrapping
UserCodeException) whose text names the original type and message and the UDF's frame; a
corrupt Parquet file fails the read; after each failure the cluster and Ray Data keep
working."""
import os
import tempfile

import ray


def bad_batch(batch):
    if 42 in batch["id"]:
        raise ValueError("bad row 42 in a batch")
    return batch


def bad_row(row):
    if row["id"] == 7:
        raise ValueError("bad row 7 in map")
    return row


class BadActor:
    def __call__(self, batch):
        raise ValueError("bad batch in an actor")


def expect_udf_error(consume, message: str, frame: str):
    try:
        consume()
    except Exception as e:  # what Ray 2.60 raises: RayTaskError(UserCodeException)
        text = str(e)
        assert isinstance(e, (ValueError, ray.exceptions.RayError)), type(e).__mro__
        assert f"ValueError: {message}" in text, text
        assert frame in text, f"no {frame!r} frame in:\n{text}"
    else:
        raise AssertionError(f"{message}: no exception")
    still_works()


def still_works():
    assert ray.data.range(50).map_batches(lambda b: b).count() == 50
    assert ray.get(ray.remote(lambda: 1).remote()) == 1


def main():
    ray.init(num_cpus=4)
    ds = ray.data.range(100, override_num_blocks=4)
    expect_udf_error(lambda: ds.map_batches(bad_batch).take_all(),
                     "bad row 42 in a batch", "in bad_batch")
    expect_udf_error(lambda: ds.map(bad_row).materialize(), "bad row 7 in map", "in bad_row")
    expect_udf_error(lambda: ds.map_batches(BadActor, concurrency=1).take_all(),
                     "bad batch in an actor", "in __call__")
    expect_udf_error(lambda: [b for b in ds.map_batches(bad_batch).iter_batches(batch_size=10)],
                     "bad row 42 in a batch", "in bad_batch")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "corrupt.parquet")
        with open(path, "wb") as f:
            f.write(b"this is not a parquet file" * 10)
        try:
            ray.data.read_parquet(path).materialize()
        except Exception as e:
            assert "parquet" in str(e).lower(), str(e)  # pyarrow's "Parquet magic bytes..."
        else:
            raise AssertionError("a corrupt Parquet file was read")
    still_works()
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()

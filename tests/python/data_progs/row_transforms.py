"""Row and column transforms (Ray Data docs "Transforming data" > transforming rows; "Working
with tabular data"; API map, flat_map, filter, add_column, drop_columns, select_columns,
rename_columns, limit): map changes each row (adding keys), flat_map turns a row into zero or
more rows, filter keeps the rows a predicate (a function, or an expression built with
ray.data.expressions.col/lit) accepts; add_column computes a column from a pandas batch (or
another batch_format); drop/select/rename_columns change the schema as asked (rename by dict
or by list); limit(n) gives n rows and is lazy over a large source; the transforms chain."""
import numpy as np
import pyarrow as pa

import ray
from ray.data.expressions import col, lit


def base():
    return ray.data.from_items([{"id": i, "name": f"n{i}", "score": i * 1.5}
                                for i in range(100)])


def check_map_flat_map_filter():
    doubled = ray.data.range(100).map(lambda r: {"id": r["id"], "double": r["id"] * 2})
    rows = doubled.take_all()
    assert sorted((r["id"], r["double"]) for r in rows) == [(i, 2 * i) for i in range(100)]
    flat = ray.data.range(10).flat_map(lambda r: [{"v": r["id"]}] * (r["id"] % 3))
    assert sorted(r["v"] for r in flat.take_all()) == sorted(
        [i for i in range(10) for _ in range(i % 3)])
    even = ray.data.range(100).filter(lambda r: r["id"] % 2 == 0)
    assert sorted(r["id"] for r in even.take_all()) == list(range(0, 100, 2))
    ranged = ray.data.range(100).filter(expr=(col("id") > 10) & (col("id") < 20))
    assert sorted(r["id"] for r in ranged.take_all()) == list(range(11, 20))
    named = base().filter(expr=col("name") == lit("n42"))
    assert named.take_all() == [{"id": 42, "name": "n42", "score": 63.0}]
    nothing = ray.data.range(10).filter(lambda r: False)
    assert nothing.count() == 0 and nothing.take_all() == []


def check_columns():
    ds = base()
    plus = ds.add_column("id2", lambda df: df["id"] * 2)
    assert plus.columns() == ["id", "name", "score", "id2"], plus.columns()
    assert all(r["id2"] == 2 * r["id"] for r in plus.take_all())
    arrow = ds.add_column("one", lambda t: pa.array(np.ones(t.num_rows, dtype=np.int32)),
                          batch_format="pyarrow")
    assert arrow.schema().types[-1] == pa.int32() and {r["one"] for r in arrow.take_all()} == {1}
    dropped = ds.drop_columns(["score"])
    assert dropped.columns() == ["id", "name"] and set(dropped.take(1)[0]) == {"id", "name"}
    sel = ds.select_columns(["score", "id"])
    assert set(sel.columns()) == {"score", "id"}
    assert set(sel.take(1)[0]) == {"id", "score"}
    ren = ds.rename_columns({"name": "label"})
    assert ren.columns() == ["id", "label", "score"], ren.columns()
    assert {r["label"] for r in ren.take_all()} == {f"n{i}" for i in range(100)}
    ren_list = ds.rename_columns(["a", "b", "c"])
    assert ren_list.columns() == ["a", "b", "c"]
    assert sorted(r["a"] for r in ren_list.take_all()) == list(range(100))


def check_limit_and_chain():
    lim = ray.data.range(1000, override_num_blocks=10).limit(7)
    assert lim.count() == 7 and len(lim.take_all()) == 7
    assert len({r["id"] for r in lim.take_all()}) == 7
    huge = ray.data.range(10**9).limit(5)  # 8 GB of ids: never read whole
    assert len(huge.take_all()) == 5
    assert ray.data.range(3).limit(10).count() == 3
    chain = (ray.data.range(200)
             .map(lambda r: {"id": r["id"], "sq": r["id"] ** 2})
             .filter(lambda r: r["sq"] % 2 == 1)
             .flat_map(lambda r: [r, {"id": -r["id"], "sq": r["sq"]}])
             .add_column("neg", lambda df: df["id"] < 0)
             .drop_columns(["sq"]))
    rows = chain.take_all()
    assert len(rows) == 200 and chain.columns() == ["id", "neg"]
    assert all(r["neg"] == (r["id"] < 0) for r in rows)


def main():
    ray.init(num_cpus=4)
    check_map_flat_map_filter()
    check_columns()
    check_limit_and_chain()
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()

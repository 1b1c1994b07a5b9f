"""Grouping and aggregation (Ray Data docs "Aggregating data", "Transforming data" > groupby;
API Dataset.groupby, GroupedData, ray.data.aggregate, Dataset.unique and the global
aggregations): groupby(key).count/sum/min/max/mean/std give one row per group with columns
named "count()", "sum(v)", ... and the right values (std with ddof=1 by default); groupby on a
list of keys groups by the tuple; aggregate() takes ray.data.aggregate functions; map_groups
hands each group's rows to a UDF at once (NumPy and pandas formats); the whole-dataset
sum/min/max/mean/std return plain numbers; unique returns each value once."""
import math
import statistics
from collections import defaultdict

import numpy as np
import pandas as pd

import ray
from ray.data.aggregate import Count, Max, Mean, Sum

ITEMS = [{"g": "abc"[i % 3], "h": i % 2, "v": float(i * 7 % 11)} for i in range(60)]


def groups(key):
    out = defaultdict(list)
    for it in ITEMS:
        out[key(it)].append(it["v"])
    return out


def by_g(ds):
    return {r["g"]: r for r in ds.take_all()}


def check_groupby_stats():
    ds = ray.data.from_items(ITEMS, override_num_blocks=5)
    g = groups(lambda it: it["g"])
    counts = by_g(ds.groupby("g").count())
    assert {k: r["count()"] for k, r in counts.items()} == {k: len(v) for k, v in g.items()}
    for name, ref in [("sum", sum), ("min", min), ("max", max), ("mean", statistics.mean),
                      ("std", statistics.stdev)]:
        rows = by_g(getattr(ds.groupby("g"), name)("v"))
        col = f"{name}(v)"
        assert set(rows) == set(g), rows
        for k, r in rows.items():
            assert math.isclose(r[col], ref(g[k]), rel_tol=1e-9), (name, k, r, ref(g[k]))
    pop = by_g(ds.groupby("g").std("v", ddof=0))
    assert all(math.isclose(r["std(v)"], statistics.pstdev(g[k])) for k, r in pop.items())
    two = ds.groupby(["g", "h"]).sum("v").take_all()
    g2 = groups(lambda it: (it["g"], it["h"]))
    assert {(r["g"], r["h"]): r["sum(v)"] for r in two} == {k: sum(v) for k, v in g2.items()}
    agg = by_g(ds.groupby("g").aggregate(Count(), Sum("v"), Max("v"), Mean("v")))
    for k, r in agg.items():
        assert r["count()"] == len(g[k]) and r["sum(v)"] == sum(g[k]), r
        assert r["max(v)"] == max(g[k]) and math.isclose(r["mean(v)"], statistics.mean(g[k]))


def check_map_groups():
    ds = ray.data.from_items(ITEMS, override_num_blocks=5)
    g = groups(lambda it: it["g"])

    def summarize(batch):
        assert len(set(batch["g"])) == 1, batch["g"]
        return {"g": batch["g"][:1], "n": np.array([len(batch["v"])]),
                "total": np.array([batch["v"].sum()])}

    out = by_g(ds.groupby("g").map_groups(summarize))
    assert {k: (r["n"], r["total"]) for k, r in out.items()} == {
        k: (len(v), sum(v)) for k, v in g.items()}

    def centre(df: pd.DataFrame) -> pd.DataFrame:
        return df.assign(v=df["v"] - df["v"].mean())

    centred = ds.groupby("g").map_groups(centre, batch_format="pandas").to_pandas()
    assert len(centred) == len(ITEMS)
    assert np.allclose(centred.groupby("g")["v"].sum().to_numpy(), 0.0)


def check_global():
    ds = ray.data.from_items(ITEMS)
    vs = [it["v"] for it in ITEMS]
    assert ds.sum("v") == sum(vs) and ds.min("v") == min(vs) and ds.max("v") == max(vs)
    assert math.isclose(ds.mean("v"), statistics.mean(vs))
    assert math.isclose(ds.std("v"), statistics.stdev(vs))
    assert isinstance(ds.sum("v"), (int, float)), type(ds.sum("v"))
    assert sorted(ds.unique("g")) == ["a", "b", "c"]
    assert sorted(ds.unique("h")) == [0, 1]
    assert sorted(ray.data.range(10).map(lambda r: {"m": r["id"] % 4}).unique("m")) == [0, 1, 2, 3]


def main():
    ray.init(num_cpus=4)
    check_groupby_stats()
    check_map_groups()
    check_global()
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()

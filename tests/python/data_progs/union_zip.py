"""Combining datasets (Ray Data docs "Transforming data"; API Dataset.union, Dataset.zip):
union concatenates the rows of two or more datasets of the same schema (none lost or
duplicated); zip pairs the i-th rows of datasets with the same number of rows but different
blockings, merging their columns and renaming a duplicate name with a suffix ("id_1"); zipping
datasets of different lengths is a ValueError naming both lengths."""
import ray


def main():
    ray.init(num_cpus=4)
    a = ray.data.range(10)
    b = ray.data.range(10).map(lambda r: {"id": r["id"] + 100})
    c = ray.data.from_items([{"id": 1000}])
    u = a.union(b, c)
    assert u.count() == 21
    assert sorted(r["id"] for r in u.take_all()) == list(range(10)) + list(range(100, 110)) + [1000]
    assert a.union(a).count() == 20

    left = ray.data.range(100, override_num_blocks=3)
    right = (ray.data.range(100, override_num_blocks=7)
             .map(lambda r: {"sq": r["id"] ** 2, "id": r["id"]}))
    z = left.zip(right)
    assert z.columns() == ["id", "sq", "id_1"], z.columns()
    rows = z.take_all()
    assert len(rows) == 100
    assert all(r["sq"] == r["id"] ** 2 and r["id_1"] == r["id"] for r in rows), rows[:3]

    named = ray.data.from_items([{"x": i} for i in range(5)])
    three = named.zip(ray.data.from_items([{"y": -i} for i in range(5)]),
                      ray.data.from_items([{"z": str(i)} for i in range(5)]))
    assert sorted((r["x"], r["y"], r["z"]) for r in three.take_all()) == [
        (i, -i, str(i)) for i in range(5)]
    try:
        ray.data.range(5).zip(ray.data.range(6)).take_all()
    except ValueError as e:  # naming both row counts
        assert "5" in str(e) and "6" in str(e), str(e)
    else:
        raise AssertionError("zipping 5 rows with 6 did not fail")
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()

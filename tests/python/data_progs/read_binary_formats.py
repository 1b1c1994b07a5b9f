"""NumPy, binary and image files (Ray Data docs "Loading data" > NumPy, images, binary; "Working
with images"; API read_numpy, read_binary_files, read_images): read_numpy gives one "data" row
per first-axis element of each .npy file; read_binary_files gives each file's bytes in "bytes"
(with include_paths, its path); read_images decodes PNGs (written here with pillow) into uint8
arrays of shape (H, W, C) in "image", resizes them with size=(H, W) and converts them with
mode="L"."""
import os
import tempfile

import numpy as np
from PIL import Image

import ray


def check_numpy(d: str):
    nd = os.path.join(d, "npy")
    os.makedirs(nd)
    np.save(os.path.join(nd, "a.npy"), np.arange(20, dtype=np.float32).reshape(5, 4))
    np.save(os.path.join(nd, "b.npy"), np.arange(20, 32, dtype=np.float32).reshape(3, 4))
    ds = ray.data.read_numpy(nd)
    assert ds.count() == 8 and ds.columns() == ["data"], (ds.count(), ds.columns())
    rows = sorted((r["data"] for r in ds.take_all()), key=lambda a: a[0])
    expect = np.arange(32, dtype=np.float32).reshape(8, 4)
    assert all(r.shape == (4,) and r.dtype == np.float32 for r in rows), rows[0]
    assert np.array_equal(np.stack(rows), expect)


def check_binary(d: str):
    bd = os.path.join(d, "bin")
    os.makedirs(bd)
    blobs = {f"f{i}.bin": os.urandom(100 + i) for i in range(4)}
    for name, blob in blobs.items():
        with open(os.path.join(bd, name), "wb") as f:
            f.write(blob)
    ds = ray.data.read_binary_files(bd, include_paths=True)
    rows = ds.take_all()
    assert len(rows) == 4 and set(rows[0]) == {"bytes", "path"}, rows[0].keys()
    got = {os.path.basename(r["path"]): bytes(r["bytes"]) for r in rows}
    assert got == blobs
    plain = ray.data.read_binary_files(bd)
    assert plain.columns() == ["bytes"]


def check_images(d: str):
    idir = os.path.join(d, "img")
    os.makedirs(idir)
    for i in range(5):
        arr = np.zeros((16, 24, 3), dtype=np.uint8)
        arr[..., 0] = i * 40
        arr[:, :12, 1] = 255
        Image.fromarray(arr).save(os.path.join(idir, f"img{i}.png"))
    ds = ray.data.read_images(idir, include_paths=True)
    rows = ds.take_all()
    assert len(rows) == 5
    for r in rows:
        img, i = r["image"], int(os.path.basename(r["path"])[3])
        assert img.shape == (16, 24, 3) and img.dtype == np.uint8, (img.shape, img.dtype)
        assert (img[..., 0] == i * 40).all() and (img[:, :12, 1] == 255).all()
        assert (img[:, 12:, 1] == 0).all()
    batch = ray.data.read_images(idir).take_batch(5)
    assert batch["image"].shape == (5, 16, 24, 3), batch["image"].shape
    small = ray.data.read_images(idir, size=(8, 12))
    assert all(r["image"].shape == (8, 12, 3) for r in small.take_all())
    gray = ray.data.read_images(idir, mode="L")
    assert all(r["image"].shape == (16, 24) for r in gray.take_all())


def main():
    ray.init(num_cpus=4)
    with tempfile.TemporaryDirectory() as d:
        check_numpy(d)
        check_binary(d)
        check_images(d)
    ray.shutdown()
    print("OK")


if __name__ == "__main__":
    main()

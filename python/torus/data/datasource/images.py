"""Image source: each file decoded with Pillow into one row, column ``image`` (H x W [x C]).

``size=(height, width)`` resizes (bilinear) and ``mode`` converts (e.g. "RGB", "L") as Ray
does. A task stacks consecutive images of one shape and dtype into a block (up to
``target_max_block_size``) holding a fixed-shape tensor column, so ``take_batch`` gives one
``(n, H, W, C)`` array; a change of shape starts a new block (blocks of different shapes meet
only when the executor concatenates them). Unreadable files raise ValueError naming the path.
"""
from __future__ import annotations

import io
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from torus.data._internal.read_task import ReadTask
from torus.data.datasource.file_source import (
    FileSourceArgs, open_stream, plan_file_tasks)
from torus.data.datasource.partitioning import Partitioning, PathPartitionParser

_CHANNELS = {"1": 1, "L": 1, "P": 1, "RGB": 3, "YCbCr": 3, "LAB": 3, "HSV": 3,
             "RGBA": 4, "CMYK": 4, "I": 4, "F": 4}


def decode_image(data: bytes, path: str, size: Optional[Tuple[int, int]],
                 mode: Optional[str]) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError
    try:
        image = Image.open(io.BytesIO(data))
    except UnidentifiedImageError as e:
        raise ValueError(f"PIL couldn't load image file at path '{path}'.") from e
    if size is not None and image.size != (size[1], size[0]):
        image = image.resize((size[1], size[0]), resample=Image.BILINEAR)
    if mode is not None and image.mode != mode:
        image = image.convert(mode)
    return np.asarray(image)


def images_to_column(images: List[np.ndarray]) -> pa.Array:
    """Images of one shape and dtype as a fixed-shape tensor column."""
    from torus.data.block import numpy_to_column
    return numpy_to_column(np.stack(images))


def read_image_files(fs: pafs.FileSystem, files: List[Tuple[str, int]], reader: Any,
                     options: Dict[str, Any], partitioning: Optional[Partitioning],
                     include_paths: bool, target_max: int, coalesce: bool
                     ) -> Iterator[pa.Table]:
    """A read task's body (``read_files``' signature): the task's images in blocks."""
    size, mode, open_args = options["size"], options["mode"], options.get("open_args")
    parse = PathPartitionParser(partitioning) if partitioning is not None else None
    images: List[np.ndarray] = []
    paths: List[str] = []
    nbytes = 0

    def flush() -> pa.Table:
        table = pa.table({"image": images_to_column(images)})
        # Rows of a block may come from different files: path columns row by row.
        parts = [parse(p) for p in paths] if parse is not None else []
        for key in dict.fromkeys(k for pt in parts for k in pt):
            table = table.append_column(key, pa.array([pt.get(key) for pt in parts]))
        if include_paths:
            table = table.append_column("path", pa.array(paths, pa.string()))
        return table

    for path, _ in files:
        with open_stream(fs, path, open_args) as f:
            arr = decode_image(f.read(), path, size, mode)
        if images and (nbytes + arr.nbytes > target_max or arr.shape != images[0].shape
                       or arr.dtype != images[0].dtype):
            yield flush()
            images, paths, nbytes = [], [], 0
        images.append(arr)
        paths.append(path)
        nbytes += arr.nbytes
    if images:
        yield flush()


def image_tasks(args: FileSourceArgs, *, size: Optional[Tuple[int, int]], mode: Optional[str],
                arrow_open_file_args: Optional[Dict[str, Any]]) -> List[ReadTask]:
    if size is not None:
        if len(size) != 2:
            raise ValueError(f"Expected `size` to contain two integers for height and width, "
                             f"but got {len(size)} integers instead.")
        if size[0] <= 0 or size[1] <= 0:
            raise ValueError(f"Expected `size` to contain positive integers, but got {size} "
                             f"instead.")
    opts = dict(size=tuple(size) if size is not None else None, mode=mode,
                open_args=arrow_open_file_args)
    tasks = plan_file_tasks(args, None, opts, rows_per_file=1, task_fn=read_image_files)
    if size is not None and mode in _CHANNELS:
        # Decoded size is known; otherwise file bytes stand in for it (Ray's default too).
        per_image = size[0] * size[1] * _CHANNELS[mode]
        for t in tasks:
            t.size_bytes = per_image * len(t.input_files)
    return tasks

"""Sources and sinks of torus.data (Ray 2.60's ``ray.data.datasource`` names).

Modules: ``paths`` (path, glob and filesystem resolution), ``file_source`` (planning shared by
the file formats), ``parquet``, ``csv_json``, ``text_binary``, ``numpy_source``, ``images``,
``in_memory`` (range and from_*), ``custom`` (user Datasources), ``sinks`` (writes),
``partitioning``. The public functions are in ``torus.data.read_api`` and on ``Dataset``.
"""
from torus.data._internal.read_task import ReadTask
from torus.data.datasource.custom import Datasource
from torus.data.datasource.file_source import FileShuffleConfig
from torus.data.datasource.partitioning import (
    PartitionStyle, Partitioning, PathPartitionFilter, PathPartitionParser)
from torus.data.datasource.sinks import SaveMode

__all__ = ["Datasource", "FileShuffleConfig", "PartitionStyle", "Partitioning",
           "PathPartitionFilter", "PathPartitionParser", "ReadTask", "SaveMode"]

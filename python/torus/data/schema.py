"""Schema: a dataset's column names and types, as Ray Data's ``Dataset.schema()`` returns."""
from __future__ import annotations

from typing import List

import pyarrow as pa


class Schema:
    def __init__(self, base: pa.Schema):
        self.base_schema = base

    @property
    def names(self) -> List[str]:
        return list(self.base_schema.names)

    @property
    def types(self) -> List[pa.DataType]:
        return list(self.base_schema.types)

    def __eq__(self, other) -> bool:
        return isinstance(other, Schema) and self.base_schema == other.base_schema

    def __repr__(self) -> str:
        width = max([len(n) for n in self.names] + [6])
        lines = ["Column" + " " * (width - 6) + "  Type", "-" * width + "  ----"]
        lines += [f"{n:<{width}}  {t}" for n, t in zip(self.names, self.types)]
        return "\n".join(lines)

"""The rows the `loghub` source produces, and typed content columns.

Every row is one log. The fixed columns come first, in this order:

    shard         int                  the shard the log was read from
    cursor        string               the cursor of the log's group (base64 of its sequence
                                       number; ``loghub.wire.decode_cursor`` gives the number)
    log_index     int                  the log's position inside its group, from 0
    receive_time  timestamp            when the group reached the service (see docs/spark.md)
    log_time      timestamp            the log's own time (``__time__``, plus ``Time_ns``)
    topic         string               the group's topic ("" when none)
    source        string               the group's source ("" when none)
    tags          map<string,string>   the group's tags
    contents      map<string,string>   the log's key/value pairs

``(shard, cursor, log_index)`` names a log uniquely and for good, so it is the key to
deduplicate on. The option ``contentColumns`` (a DDL list such as ``"status int, latency_ms
double"``) adds one typed column per listed content key after these; a value that does not
parse as the type reads as null. Only ``receive_time`` and the typed content columns are
nullable; the other columns and the maps' values are never null and say so, which spares
Spark their null checks when it makes rows. The Arrow schema the reader builds
(``arrow_schema``) equals the Spark schema field for field, nullability included, as Spark
requires.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type information
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from loghub.errors import ParameterInvalid

__all__ = [
    "BASE_COLUMNS",
    "CONTENT_TYPES",
    "ContentColumn",
    "arrow_schema",
    "parse_content_columns",
    "spark_schema",
]

_TIMESTAMP = pa.timestamp("us", tz="UTC")  # the only timestamp Arrow type Spark accepts
# keys and values are never null (Spark's maps never have null keys)
STRING_MAP = pa.map_(
    pa.field("key", pa.string(), nullable=False), pa.field("value", pa.string(), nullable=False)
)

BASE_COLUMNS: tuple[tuple[str, str, object, bool], ...] = (
    ("shard", "int", pa.int32(), False),
    ("cursor", "string", pa.string(), False),
    ("log_index", "int", pa.int32(), False),
    ("receive_time", "timestamp", _TIMESTAMP, True),
    ("log_time", "timestamp", _TIMESTAMP, False),
    ("topic", "string", pa.string(), False),
    ("source", "string", pa.string(), False),
    ("tags", "map<string,string>", STRING_MAP, False),
    ("contents", "map<string,string>", STRING_MAP, False),
)
"""(name, Spark DDL type, Arrow type, nullable) of every fixed column, in schema order."""

CONTENT_TYPES: dict[str, tuple[str, object]] = {
    "string": ("string", pa.string()),
    "int": ("int", pa.int32()),
    "integer": ("int", pa.int32()),
    "bigint": ("bigint", pa.int64()),
    "long": ("bigint", pa.int64()),
    "double": ("double", pa.float64()),
    "float": ("float", pa.float32()),
    "real": ("float", pa.float32()),
    "boolean": ("boolean", pa.bool_()),
}
"""The types a typed content column may have: DDL spelling -> (canonical DDL, Arrow type)."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_COLUMN = re.compile(r"\s*(?:`([^`,]+)`|([^\s`,]+))\s+([A-Za-z]+)\s*")


@dataclass(frozen=True)
class ContentColumn:
    """A content key read into a column of its own: ``key`` is both the content key and the
    column name; ``ddl_type`` is one of the canonical names in ``CONTENT_TYPES``."""

    key: str
    ddl_type: str

    @property
    def arrow_type(self) -> object:
        return CONTENT_TYPES[self.ddl_type][1]

    @property
    def ddl(self) -> str:
        name = self.key if _NAME.fullmatch(self.key) else f"`{self.key}`"
        return f"{name} {self.ddl_type}"


def parse_content_columns(text: str) -> tuple[ContentColumn, ...]:
    """``"status int, `request-time` double"`` as columns; ``ParameterInvalid`` when it is
    not such a list, names a fixed column, repeats a name or uses a type not supported."""
    if not text.strip():
        return ()
    columns: list[ContentColumn] = []
    fixed = {name for name, _, _, _ in BASE_COLUMNS}
    for item in text.split(","):
        match = _COLUMN.fullmatch(item)
        if match is None:
            raise ParameterInvalid(
                f"contentColumns: {item.strip()!r} is not '<key> <type>' (quote keys with "
                "backticks when they are not plain names)"
            )
        key = match.group(1) or match.group(2)
        type_name = match.group(3).lower()
        if type_name not in CONTENT_TYPES:
            raise ParameterInvalid(
                f"contentColumns: type {type_name!r} of {key!r} is not one of "
                f"{', '.join(sorted(CONTENT_TYPES))}"
            )
        if key in fixed or any(c.key == key for c in columns):
            raise ParameterInvalid(f"contentColumns: column name {key!r} is already taken")
        columns.append(ContentColumn(key, CONTENT_TYPES[type_name][0]))
    return tuple(columns)


_SPARK_TYPES: dict[str, DataType] = {
    "int": IntegerType(),
    "bigint": LongType(),
    "string": StringType(),
    "timestamp": TimestampType(),
    "double": DoubleType(),
    "float": FloatType(),
    "boolean": BooleanType(),
    "map<string,string>": MapType(StringType(), StringType(), valueContainsNull=False),
}


def spark_schema(content_columns: tuple[ContentColumn, ...] = ()) -> StructType:
    """The source's schema (built without a JVM, which the Python workers do not have)."""
    fields = [
        StructField(name, _SPARK_TYPES[ddl], nullable) for name, ddl, _, nullable in BASE_COLUMNS
    ]
    fields += [StructField(c.key, _SPARK_TYPES[c.ddl_type], True) for c in content_columns]
    return StructType(fields)


def arrow_schema(content_columns: tuple[ContentColumn, ...] = ()) -> pa.Schema:
    """The Arrow schema of the record batches the reader yields: ``spark_schema`` field for
    field, nullability included, as Spark requires."""
    fields = [
        pa.field(name, arrow_type, nullable) for name, _, arrow_type, nullable in BASE_COLUMNS
    ]
    fields += [pa.field(column.key, column.arrow_type) for column in content_columns]
    return pa.schema(fields)

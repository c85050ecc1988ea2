"""Rows held as JSON text, parsed back on the driver, in Arrow, as Spark would parse them.

Contract: for JSON text that Spark's ``to_json`` wrote from a row of ``schema``
with ``JSON_OPTIONS`` (a null row or an absent field is null), ``parsed`` gives
exactly the Arrow table that ``from_json(text, schema, JSON_OPTIONS)`` collected
as Arrow gives (``collect.arrow_schema``): same names, order, types and values.
It does so only where that is sure:

- ``parsed_on_driver(schema)``: every column is of a type whose JSON text
  Spark and Arrow read to the same value: strings, booleans, integers,
  floats and doubles (both engines round the decimal text correctly),
  decimals (exact), dates, timestamps (to the microsecond; with their offset,
  in UTC) and timestamps without a time zone. Any other type (nested structs,
  arrays, maps, binary, intervals, variants, char/varchar, ...) is not taken.
- ``parsed`` gives None when Arrow's reader refuses a text: a float or double
  that is NaN or infinite (Spark writes those as the strings ``"NaN"``,
  ``"Infinity"``), a date or timestamp beyond year 9999, any text that does
  not fit the schema. The caller then parses with Spark, which reads those.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

JSON_OPTIONS = {
    "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
    "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS",
}
"""How rows are written as JSON: timestamps to the microsecond, so they read back exactly."""
_TAKEN: tuple[type[DataType], ...] = (
    StringType,
    BooleanType,
    ByteType,
    ShortType,
    IntegerType,
    LongType,
    FloatType,
    DoubleType,
    DecimalType,
    DateType,
    TimestampType,
    TimestampNTZType,
)
_BLOCK_BYTES = 1 << 20
"""Arrow's default JSON block; a block must hold the longest row."""


def parsed_on_driver(schema: StructType) -> bool:
    """Whether ``parsed`` takes rows of ``schema``: each column of a type in the module's list."""
    return all(type(f.dataType) in _TAKEN for f in schema.fields)


def parsed(rows: pa.ChunkedArray | pa.Array, arrow: pa.Schema) -> pa.Table | None:
    """``rows`` (JSON objects, one a row; null for a row of nulls) as a table of ``arrow``
    (``collect.arrow_schema`` of a schema ``parsed_on_driver`` takes), one row per row; or
    None when Arrow's reader refuses a text (the module's docstring)."""
    if not len(rows):  # nullable, as every column of Spark's parse of a row
        return pa.schema([f.with_nullable(True) for f in arrow]).empty_table()
    # Every column nullable (a side's NOT NULL column is null in an outer row's missing
    # side). Arrow reads a date only as a timestamp: dates are read as text and cast (the
    # same ISO form, strictly).
    read = pa.schema([(f.name, pa.string() if f.type == pa.date32() else f.type) for f in arrow])
    text = pc.fill_null(rows, "{}").cast(pa.large_string())
    if isinstance(text, pa.ChunkedArray):
        text = text.combine_chunks()
    # Each row and a newline, back to back in one new buffer: the lines Arrow reads.
    empty, newline = pa.scalar("", pa.large_string()), pa.scalar("\n", pa.large_string())
    ended = pc.binary_join_element_wise(text, empty, newline)
    offsets = np.frombuffer(ended.buffers()[1], np.int64)[ended.offset :][: len(ended) + 1]
    lines = ended.buffers()[2][offsets[0] : offsets[-1]]
    longest = pc.max(pc.binary_length(ended)).as_py()
    try:
        table = pj.read_json(
            pa.BufferReader(lines),
            read_options=pj.ReadOptions(block_size=max(_BLOCK_BYTES, longest)),
            parse_options=pj.ParseOptions(explicit_schema=read, unexpected_field_behavior="ignore"),
        )
        columns = [table.column(f.name).cast(f.type) for f in arrow]
    except pa.ArrowInvalid:
        return None
    return pa.table(columns, names=arrow.names)  # nullable, as above

"""Values that change from batch to batch, kept out of the code Spark generates.

Spark compiles a plan's stages to Java and caches the classes by their source.
A literal number or timestamp is written into that source, so a plan that
differs from the last batch's only by a watermark, a processing time or a
batch id would be compiled again: 30-80 ms a batch on the 2-core machine,
about a tenth of a small batch. These columns hand Spark the value inside a
higher-order function, which Spark neither folds into a literal nor compiles
(it evaluates it per record, about 20 ns): the next batch's plan compiles to
the same source and reuses its classes (``tests/batches/loop/test_compiled_code.py``).
Each is one SQL expression: a Python lambda would cost 3.5 ms of calls into the
JVM to build, an expression 0.2 ms.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column


def batch_long(value: int) -> Column:
    """``value`` as a BIGINT column whose value Spark's generated code does not hold."""
    return _held_out(f"CAST({int(value)} AS BIGINT)")


def batch_timestamp(micros: int) -> Column:
    """The timestamp ``micros`` after the epoch, likewise (a time zone cannot shift it)."""
    return _held_out(f"timestamp_micros({int(micros)})")


def _held_out(sql: str) -> Column:
    """The value of ``sql`` (an expression of literals) through a higher-order function."""
    from pyspark.sql import functions as F

    return F.expr(f"element_at(transform(array({sql}), v -> v), 1)")

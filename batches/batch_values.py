"""Values that change from batch to batch, kept out of the code Spark generates.

Spark compiles a plan's stages to Java and caches the classes by their source.
A literal number or timestamp is written into that source, so a plan that
differs from the last batch's only by a watermark or a processing time is
compiled again: 30-80 ms a batch on the 2-core machine, about a tenth of a
small batch. ``batch_value`` hands Spark the value inside a higher-order
function, which Spark neither folds into a literal nor compiles (it evaluates
it per record, about 20 ns): the next batch's plan compiles to the same
source and reuses its classes (tested: ``tests/batches/test_batch_values.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column


def batch_value(value: Column) -> Column:
    """``value`` (a literal) as a column whose value Spark's generated code does not hold."""
    from pyspark.sql import functions as F

    return F.element_at(F.transform(F.array(value), lambda v: v), 1)

"""Steps written as SQL: a transform over a batch's records, a post-aggregation step over
the windows a batch emits.

A ``SqlStep`` is one Spark SQL query (``SELECT ... FROM input``) over one
relation: ``input`` (the batch's records, for ``transform``) or ``windows``
(the windows the batch emits, for ``post_aggregation``). The relation is
bound to the query alone: the frame is handed to ``spark.sql`` as a
DataFrame argument (a temporary view of a name of Spark's own making,
dropped once the query is analysed) and named by a CTE around the query, so
two pipelines, or two batches, never see each other's records.

``spark.sql`` analyses the query at once and runs no job: a syntax error, an
unknown column or function, or a query that is no ``SELECT`` fails when the
step's frame is built, before the batch's first Spark job, as
``DefinitionInvalid`` in one line naming the pipeline and the step: a definition
error, never counted against the batch (``lowmark.batches.loop.poison``).

Replays must compute what the first attempt did: a query Spark calls
non-deterministic (``rand()``, ``uuid()``, ``shuffle()``...) is refused. The
clock's functions (``current_timestamp()``, ``now()``, ``current_date()``)
and reads of other tables are not caught: they make a replay differ, do not
use them (event time is the record's own column).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias

from pydantic import Field, field_validator

from lowmark.batches.config import UserConfig
from lowmark.batches.errors import DefinitionInvalid
from lowmark.state.errors import first_line

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    Transform: TypeAlias = Callable[[DataFrame], DataFrame]
else:
    # What pydantic checks of a step is that it is callable; so reading a definition
    # (`lowmark list`, `show`) never imports PySpark, which only a batch needs.
    Transform = Callable[[Any], Any]
"""A step as a Python function: DataFrame → DataFrame."""

_BOUND = "_lowmark_relation"
_PREFIX = "WITH {relation} AS (SELECT * FROM {{" + _BOUND + "}})\nSELECT * FROM (\n"
_PREFIX_LINES = 2
"""Lines of ``_PREFIX`` before the user's query (Spark's error positions count them)."""


class SqlStep(UserConfig):
    """A step written as one Spark SQL query (``SELECT ... FROM input``, or ``FROM windows``
    after the aggregation); it must be deterministic (see ``lowmark.batches.sql``)."""

    sql: str = Field(
        min_length=1,
        description="A Spark SQL SELECT over `input` (transform: the batch's records) or "
        "`windows` (post_aggregation: the windows the batch emits).",
    )

    @field_validator("sql")
    @classmethod
    def _not_blank(cls, sql: str) -> str:
        if not sql.strip():
            raise ValueError("the SQL is blank: write a SELECT")
        return sql

    @property
    def text(self) -> str:
        """The query as fingerprinted and run: without surrounding whitespace or a final ``;``."""
        return self.sql.strip().removesuffix(";").rstrip()

    def over(self, frame: DataFrame, relation: str, what: str) -> DataFrame:
        """The query over ``frame``, named ``relation``; analysed now, lazy otherwise.
        ``what`` names the step in errors ("the transform of pipeline p")."""
        from pyspark.errors import PySparkException

        from lowmark.state.session import is_remote_session

        escaped = self.text.replace("{", "{{").replace("}", "}}")
        query = _PREFIX.format(relation=relation) + escaped + "\n)"
        try:
            bound: dict[str, Any] = {_BOUND: frame}
            out = frame.sparkSession.sql(query, **bound)
        except PySparkException as exc:
            raise DefinitionInvalid(
                f"{what}: its SQL fails: {_user_lines(first_line(exc))}: correct the query "
                f"(a SELECT over `{relation}`)"
            ) from exc
        # Over Spark Connect the client sees no analysed plan: the check is not made there.
        remote = is_remote_session(out.sparkSession)
        if not remote and not out._jdf.queryExecution().analyzed().deterministic():
            raise DefinitionInvalid(
                f"{what}: its SQL is not deterministic (rand(), uuid(), shuffle()...), so a "
                "replay would write other rows: compute from the records' own columns"
            )
        return out


Step = Transform | SqlStep
"""A transform or post-aggregation step: a Python function, or a ``SqlStep``."""


def apply_step(step: Step | None, frame: DataFrame, relation: str, what: str) -> DataFrame:
    """``frame`` through ``step`` (unchanged without one); a ``SqlStep`` sees it as
    ``relation``, and its errors name ``what``."""
    if step is None:
        return frame
    if isinstance(step, SqlStep):
        return step.over(frame, relation, what)
    return step(frame)


def step_semantics(step: Step | None) -> object:
    """What the fingerprint hashes of a step: a function as itself (hashed by its import
    path, as transforms always were), a query as ``{"sql": text}``."""
    if isinstance(step, SqlStep):
        return {"sql": step.text}
    return step


def _user_lines(message: str) -> str:
    """Spark's ``message`` with its line numbers counted from the user's query."""
    return re.sub(
        r"\bline (\d+)", lambda m: f"line {max(1, int(m.group(1)) - _PREFIX_LINES)}", message
    )

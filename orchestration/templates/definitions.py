"""This project as Dagster sees it (``workspace.yaml`` loads this file).

Each pipeline that ``lowmark.toml`` points at becomes assets (its Delta table, its
late and bad-records tables, its input) with checks, a micro-batch job and the
sensor that starts it when files land, and a checkpoint-maintenance schedule,
over the data root ``lowmark.toml`` names. Environment variables set by hand
(``LOWMARK_PIPELINES``, ``LOWMARK_DATA_ROOT``) win over the file.
"""

from pathlib import Path

from lowmark.orchestration.project import project_definitions

defs = project_definitions(Path(__file__).resolve().parent)

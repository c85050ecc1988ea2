"""Errors a user can cause around a lowmark project (``lowmark init``, ``lowmark.toml``) and
its Dagster instance.

One line each, naming the file or folder and the way out. ``LowmarkError`` is the
common base the CLI turns into a clean message.
"""

from __future__ import annotations

from lowmark.state.errors import LowmarkError


class ProjectFileInvalid(LowmarkError):
    """A project's ``lowmark.toml`` is not valid TOML or fails validation."""


class ProjectFolderNotEmpty(LowmarkError):
    """``lowmark init`` was pointed at a folder that holds something (it never overwrites)."""


class ProjectUnsafe(LowmarkError):
    """A project folder (or its ``lowmark.toml``) someone else could have written, which
    the user has not said to trust: lowmark would run its code."""


class SparkSettingsFixed(LowmarkError):
    """A run's Spark settings that the Spark it was lent (the warm runner's) cannot take at
    runtime."""


class NotHandedRuns(LowmarkError):
    """The instance's run launcher is not lowmark's: no run would come to the runner."""

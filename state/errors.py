"""Errors raised by the durable state layer.

Every message is one line that names the thing at fault and the way out.
"""

from __future__ import annotations

import re


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (its type when it has none); for a JVM error,
    of its root cause's (the error a task hit, not the call that surfaced it); for a
    Python error on an executor, the traceback's last line (the error raised); for a
    Spark Connect call the server refused, its details and status (the error's first line
    only announces them)."""
    java = getattr(exc, "java_exception", None)
    if java is not None:
        while java.getCause() is not None and not java.getCause().equals(java):
            java = java.getCause()
        text = str(java.toString()).strip()
    else:
        text = str(exc).strip()
    lines = text.splitlines()
    refused = _RPC_REFUSED.search(text) if lines and lines[0].startswith("<_") else None
    if refused is not None:
        return f"{refused['details']} ({refused['status']})"
    traceback = next((i for i, line in enumerate(lines[:2]) if _TRACEBACK in line), None)
    if traceback is not None:
        # Python code on an executor raised: its error is the traceback's last line (a
        # lowmark error's message, say), not the lines that announce the traceback.
        after = lines[traceback + 1 :]
        raised = [line for line in after if line.strip() and not line[0].isspace()]
        if raised:
            return raised[-1]
    return lines[0] if lines else type(exc).__name__


_TRACEBACK = "Traceback (most recent call last):"
_RPC_REFUSED = re.compile(r'status = StatusCode\.(?P<status>\w+)\s+details = "(?P<details>[^"]*)"')
"""A gRPC error's text (``<_InactiveRpcError of RPC that terminated with:`` and its fields)."""


def jvm_causes(exc: BaseException) -> list[str]:
    """The Java class names of a JVM error and of its causes, outermost first (none for
    a Python error)."""
    names: list[str] = []
    java = getattr(exc, "java_exception", None)
    while java is not None and len(names) < _MAX_CAUSES:
        names.append(str(java.getClass().getName()))
        cause = java.getCause()
        java = None if cause is None or cause.equals(java) else cause
    return names


_MAX_CAUSES = 32
"""Causes ``jvm_causes`` follows (a cause chain can loop back on itself)."""


class LowmarkError(Exception):
    """Base of every error lowmark raises on purpose (a user can act on it)."""


class CheckpointError(LowmarkError):
    """A checkpoint cannot be used as it is."""


class CheckpointCorrupt(CheckpointError):
    """The offset log and commit log break the recovery invariant."""


class CheckpointMissing(CheckpointError):
    """A checkpoint table that must exist is gone."""


class CheckpointReplaced(CheckpointError):
    """The checkpoint a runner opened was moved aside and another created in its place
    (``lowmark reset``): the runner stops, writing nothing into the new one."""


class UnsupportedCheckpointFormat(CheckpointError):
    """A checkpoint was written in a newer format than this lowmark reads."""


class UnsupportedLogFormat(UnsupportedCheckpointFormat):
    """A log entry was written in a newer format than this lowmark reads."""


class ReplayRuleChanged(CheckpointError):
    """A pending batch was planned under a rule this lowmark no longer runs by."""


class FingerprintMismatch(CheckpointError):
    """The pipeline's semantics changed since its checkpoint was written."""


class ConcurrentRunner(LowmarkError):
    """Another runner wrote the same batch of the same pipeline."""


class TransientError(LowmarkError):
    """Something a batch reads or writes was briefly away (a connection cut, a failover, a
    broker unavailable, a lost write race): the runner tries the batch again after a pause
    and does not count it as a failed attempt (``lowmark.batches.loop.poison``)."""


class WriteConflict(TransientError):
    """A Delta write kept losing to another writer of the same table."""

"""One-line messages of the errors lowmark passes on (``lowmark.state.errors.first_line``)."""

from __future__ import annotations

from pyspark.errors.exceptions.connect import SparkConnectGrpcException

from lowmark.state.errors import first_line


def test_a_spark_connect_call_the_server_refused_is_told_by_its_details_and_status() -> None:
    """What pyspark raises when a Connect server refuses a call: its first line only says
    that an RPC ended (a reset through a server that wants a token once said no more)."""
    refused = SparkConnectGrpcException(
        message="<_InactiveRpcError of RPC that terminated with:\n"
        "\tstatus = StatusCode.UNAUTHENTICATED\n"
        '\tdetails = "No authentication token provided"\n'
        '\tdebug_error_string = "UNAUTHENTICATED:No authentication token provided"\n>'
    )
    assert first_line(refused) == "No authentication token provided (UNAUTHENTICATED)"


def test_any_other_error_is_told_by_its_first_line() -> None:
    assert first_line(ValueError("the column ts is missing\nmore detail")) == (
        "the column ts is missing"
    )
    assert first_line(ValueError()) == "ValueError"

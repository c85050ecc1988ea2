"""A real S3-compatible server for tests: moto's server mode, on a free loopback port.

moto (PyPI, ``moto[server]``) serves S3's REST API over HTTP as any S3-compatible
store does, and enforces conditional puts: a ``PUT`` with ``If-None-Match: *`` of a
key that exists is answered 412 Precondition Failed, which is what both of lowmark's
writers rely on to commit a Delta version at most once (``lowmark.state.storage``).
moto checks and stores in two steps, so this server handles one request at a time:
the check and the put of a request are then atomic, as on S3 itself.

It runs in a process of its own (``python -m tests.s3_server PORT``): some delta-rs
calls hold the GIL while they wait for the store, which a server in the caller's
process could then never answer. One route of its own, ``POST /_test/age``, makes the
objects under a prefix older (``S3Server.age``), as the local crash tests set a log
file's time with ``os.utime``: S3 stamps an object with the time it was written, and
maintenance deletes log files by their age.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlencode

import boto3

ACCESS_KEY = "lowmark-test"
SECRET_KEY = "lowmark-test-secret"
REGION = "us-east-1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


AGE_ROUTE = "/_test/age"


class _Server:
    """moto's app, one request at a time, with the ``AGE_ROUTE`` of its own."""

    def __init__(self) -> None:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            create_backend_app,
        )

        self.app = DomainDispatcherApplication(create_backend_app)
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        with self.lock:
            if environ["PATH_INFO"] == AGE_ROUTE:
                asked = parse_qs(environ["QUERY_STRING"], keep_blank_values=True)
                query = {k: v[0] for k, v in asked.items()}
                try:
                    aged = _age(query["bucket"], query["prefix"], float(query["seconds"]))
                except Exception:  # the test that asked sees why
                    start_response("500 Internal Server Error", [("Content-Type", "text/plain")])
                    return [traceback.format_exc().encode()]
                start_response("200 OK", [("Content-Type", "application/json")])
                return [json.dumps({"aged": aged}).encode()]
            return list(self.app(environ, start_response))


def _age(bucket: str, prefix: str, seconds: float) -> int:
    """Make the objects under ``prefix`` in ``bucket`` ``seconds`` older; how many."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    aged = 0
    for key in s3_backends[DEFAULT_ACCOUNT_ID]["aws"].buckets[bucket].keys.values():
        if key.name.startswith(prefix):
            key.last_modified -= timedelta(seconds=seconds)
            aged += 1
    return aged


def main() -> None:
    """Serve on ``127.0.0.1:<argv[1]>`` until killed."""
    from werkzeug.serving import WSGIRequestHandler, make_server

    class Quiet(WSGIRequestHandler):
        """Logs no line per request (a run makes thousands)."""

        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            pass

    port = int(sys.argv[1])
    make_server("127.0.0.1", port, _Server(), threaded=True, request_handler=Quiet).serve_forever()


@dataclass
class S3Server:
    """The server on ``127.0.0.1:port``; ``start`` it, ``stop`` it."""

    port: int
    process: subprocess.Popen[bytes]

    @classmethod
    def start(cls) -> S3Server:
        port = _free_port()
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.s3_server", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return cls(port, process)
            except OSError as exc:
                if process.poll() is not None or time.monotonic() > deadline:
                    process.kill()
                    raise RuntimeError(f"the S3 test server did not start on port {port}") from exc
                time.sleep(0.1)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What lowmark (and a subprocess of it) needs to reach this server."""
        return {
            "LOWMARK_S3_ENDPOINT": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
        }

    def client(self) -> Any:
        """A boto3 S3 client of this server."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )

    def create_bucket(self, name: str) -> str:
        """Create the bucket ``name``; its URL (``s3a://name``)."""
        self.client().create_bucket(Bucket=name)
        return f"s3a://{name}"

    def keys(self, bucket: str, prefix: str) -> Iterator[str]:
        """The keys under ``prefix`` in ``bucket``."""
        pages = self.client().get_paginator("list_objects_v2")
        for page in pages.paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                yield str(item["Key"])

    def age(self, bucket: str, prefix: str, by: timedelta) -> int:
        """Make the objects under ``prefix`` in ``bucket`` ``by`` older; how many there are."""
        query = urlencode({"bucket": bucket, "prefix": prefix, "seconds": by.total_seconds()})
        request = urllib.request.Request(f"{self.endpoint}{AGE_ROUTE}?{query}", method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(json.loads(response.read())["aged"])


if __name__ == "__main__":
    main()

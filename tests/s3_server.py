"""A real S3-compatible server for tests: moto's server mode, on a free loopback port.

moto (PyPI, ``moto[server]``) serves S3's REST API over HTTP as any S3-compatible
store does, and enforces conditional puts: a ``PUT`` with ``If-None-Match: *`` of a
key that exists is answered 412 Precondition Failed, which is what both of lowmark's
writers rely on to commit a Delta version at most once (``lowmark.state.storage``).
moto checks and stores in two steps, so this server handles one request at a time:
the check and the put of a request are then atomic, as on S3 itself.

It runs in a process of its own (``python -m tests.s3_server PORT``): some delta-rs
calls hold the GIL while they wait for the store, which a server in the caller's
process could then never answer. Two routes of its own (under ``/_test/``):

- ``age`` makes the objects under a prefix older (``S3Server.age``), as the local crash
  tests set a log file's time with ``os.utime``: S3 stamps an object with the time it
  was written, and maintenance deletes log files by their age;
- ``race`` lets another writer win the race for a key (``S3Server.race``): its object
  lands just before the next conditional put of that key, so the put must be refused,
  as when two writers commit the same Delta version at once.
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

from lowmark.state.connect_server import free_port

ACCESS_KEY = "lowmark-test"
SECRET_KEY = "lowmark-test-secret"
REGION = "us-east-1"


CONTROL = "/_test/"
"""The server's own routes: ``age`` and ``race`` (``S3Server.age``, ``S3Server.race``)."""


class _Server:
    """moto's app, one request at a time, with the ``CONTROL`` routes of its own."""

    def __init__(self) -> None:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            create_backend_app,
        )

        self.app = DomainDispatcherApplication(create_backend_app)
        self.lock = threading.Lock()
        self.races: dict[str, bytes] = {}
        """``/bucket/key`` → the body another writer puts there just before the next
        conditional put of that key."""

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        with self.lock:
            path = environ["PATH_INFO"]
            if path.startswith(CONTROL):
                asked = parse_qs(environ["QUERY_STRING"], keep_blank_values=True)
                query = {k: v[0] for k, v in asked.items()}
                try:
                    done = self._control(path.removeprefix(CONTROL), query, environ)
                except Exception:  # the test that asked sees why
                    start_response("500 Internal Server Error", [("Content-Type", "text/plain")])
                    return [traceback.format_exc().encode()]
                start_response("200 OK", [("Content-Type", "application/json")])
                return [json.dumps(done).encode()]
            conditional = environ.get("HTTP_IF_NONE_MATCH") == "*"
            if environ["REQUEST_METHOD"] == "PUT" and conditional and path in self.races:
                bucket, _, key = path.removeprefix("/").partition("/")
                _backend().put_object(bucket, key, self.races.pop(path))
            return list(self.app(environ, start_response))

    def _control(self, route: str, query: dict[str, str], environ: dict[str, Any]) -> Any:
        if route == "age":
            return _age(query["bucket"], query["prefix"], float(query["seconds"]))
        if route == "race":
            body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
            self.races[f"/{query['bucket']}/{query['key']}"] = body
            return len(self.races)
        raise ValueError(f"no route {route}")


def _backend() -> Any:
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    return s3_backends[DEFAULT_ACCOUNT_ID]["aws"]


def _age(bucket: str, prefix: str, seconds: float) -> int:
    """Make the objects under ``prefix`` in ``bucket`` ``seconds`` older; how many."""
    aged = 0
    for key in _backend().buckets[bucket].keys.values():
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
        port = free_port()
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
        seconds = by.total_seconds()
        return int(self._control("age", {"bucket": bucket, "prefix": prefix, "seconds": seconds}))

    def race(self, bucket: str, key: str, theirs: bytes) -> None:
        """Another writer wins the race for ``key``: it puts ``theirs`` there just before the
        next conditional put (``If-None-Match: *``) of ``key`` reaches the store."""
        self._control("race", {"bucket": bucket, "key": key}, theirs)

    def _control(self, route: str, query: dict[str, Any], body: bytes = b"") -> Any:
        url = f"{self.endpoint}{CONTROL}{route}?{urlencode(query)}"
        request = urllib.request.Request(url, data=body, method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())


if __name__ == "__main__":
    main()

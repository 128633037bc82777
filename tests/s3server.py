"""A real S3-compatible server for tests: moto's server mode on 127.0.0.1, shared by the store and service tests.

``running(bucket)`` sets test credentials in the environment (never the user's AWS config, never a metadata
service), starts the server on a free loopback port, creates ``bucket`` and stops the server afterwards. The server
can be told to stop inside a PUT whose path contains ``trip`` (answered 503, then the server goes away), so a writer
sees it vanish in the middle of its commit; moto keeps its buckets in this process, so a restart on the same port
serves what was stored before.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from typing import Iterator

import pytest

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": os.devnull,
               "AWS_SHARED_CREDENTIALS_FILE": os.devnull}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoS3:
    """moto's S3 server on 127.0.0.1:``port``; ``trip``: stop inside the next PUT whose path contains it."""

    def __init__(self, bucket: str):
        self.bucket, self.port = bucket, free_port()
        self.trip: str | None = None
        self.server = None

    def start(self) -> None:
        from moto.server import ThreadedMotoServer

        owner = self

        class Server(ThreadedMotoServer):
            def _server_entry(self) -> None:
                from moto.server import DomainDispatcherApplication, create_backend_app
                from werkzeug.serving import make_server

                app = DomainDispatcherApplication(create_backend_app)

                def tripwire(environ, start_response):
                    if owner.trip and environ["REQUEST_METHOD"] == "PUT" and owner.trip in environ.get("PATH_INFO", ""):
                        owner.trip = None
                        threading.Thread(target=owner.stop, daemon=True).start()
                        start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
                        return [b""]
                    return app(environ, start_response)

                self._server = make_server(self._ip_address, self._port, tripwire, True)
                self._server_ready_event.set()
                self._server.serve_forever()

        self.server = Server(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    def stop(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.stop()

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=f"http://127.0.0.1:{self.port}", aws_access_key_id="testing",
                            aws_secret_access_key="testing", region_name="us-east-1")

    def uri(self, prefix: str = "zoo") -> str:
        # allow_delayed_open: small writes go out as one PutObject (moto mis-answers multipart completion)
        return (f"s3://{self.bucket}/{prefix}?endpoint_override=127.0.0.1:{self.port}&scheme=http&region=us-east-1"
                "&allow_delayed_open=true")


@contextlib.contextmanager
def running(bucket: str, server: type[MotoS3] = MotoS3) -> Iterator[MotoS3]:
    """A started server (of class ``server``) with ``bucket`` created, under test credentials."""
    pytest.importorskip("moto.server")
    pytest.importorskip("boto3")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in CREDENTIALS.items():
            mp.setenv(k, v)
        mp.delenv("AWS_PROFILE", raising=False)
        mp.delenv("AWS_ENDPOINT_URL", raising=False)
        s3 = server(bucket)
        s3.start()
        try:
            s3.client().create_bucket(Bucket=bucket)
            yield s3
        finally:
            s3.stop()

"""A real S3-protocol server on loopback for the tests: moto's ``ThreadedMotoServer``.

It runs inside the test process (one per test session, port chosen by the OS, 127.0.0.1
only) and enforces conditional writes (``If-None-Match: *``, ``If-Match``) as S3 does.
Every test gets its own bucket. The credentials are fake but distinctive, so a test can
assert that they never appear in anything the engine writes or raises.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote

from tests.sent_bytes import SentBytes

ACCESS_KEY_ID = "AKIATIDELAKETESTKEY7"
SECRET_ACCESS_KEY = "tidelake-test-secret-Zq9vX3mK"
REGION = "us-east-1"
_REQUEST = re.compile(r'"(?:\x1b\[[0-9;]*m)*(GET|PUT|HEAD|DELETE|POST) (\S+) HTTP')


@dataclass
class S3Server:
    """The running server: its endpoint and a way to make buckets."""

    endpoint: str
    _server: Any = field(repr=False)
    _count: itertools.count = field(default_factory=itertools.count, repr=False)

    _sent: SentBytes = field(default_factory=lambda: SentBytes(None), repr=False)

    @classmethod
    def start(cls) -> S3Server:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        sent = SentBytes.install(server)
        return cls(f"http://{host}:{port}", server, _sent=sent)

    @contextlib.contextmanager
    def fetched(self, bucket: str) -> Iterator[list[tuple[str, int]]]:
        """The object ``GET`` answers the server sends for ``bucket`` while the block runs:
        (key, bytes of the answer's body), counted at the server."""
        with self._sent.watch(bucket) as seen:
            yield seen

    def stop(self) -> None:
        self._server.stop()

    @property
    def storage_options(self) -> dict[str, str]:
        """object_store options (what the engine and hudi-rs take) for this server."""
        return {"aws_endpoint_url": self.endpoint, "aws_allow_http": "true",
                "aws_access_key_id": ACCESS_KEY_ID,
                "aws_secret_access_key": SECRET_ACCESS_KEY, "aws_region": REGION}

    def client(self) -> Any:
        """A boto3 client of the server (for the tests' own looks at the bucket)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=ACCESS_KEY_ID,
                            aws_secret_access_key=SECRET_ACCESS_KEY)

    @contextlib.contextmanager
    def requests(self, bucket: str) -> Iterator[list[tuple[str, str]]]:
        """The requests the server receives for ``bucket`` while the block runs, from its own
        request log: (``LIST``, the listed prefix) for a listing, else (method, key)."""
        seen: list[tuple[str, str]] = []

        class Counter(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                match = _REQUEST.search(record.getMessage())
                if match is None:
                    return
                method, target = match.groups()
                path, _, query = target.partition("?")
                parts = path.lstrip("/").split("/", 1)
                if parts[0] != bucket:
                    return
                args = parse_qs(query)
                if method == "GET" and "list-type" in args:
                    seen.append(("LIST", unquote(args.get("prefix", [""])[0])))
                else:
                    seen.append((method, unquote(parts[1]) if len(parts) > 1 else ""))

        werkzeug = logging.getLogger("werkzeug")
        handler, level, propagate = Counter(), werkzeug.level, werkzeug.propagate
        werkzeug.addHandler(handler)
        werkzeug.setLevel(logging.INFO)
        werkzeug.propagate = False
        try:
            yield seen
        finally:
            werkzeug.removeHandler(handler)
            werkzeug.setLevel(level)
            werkzeug.propagate = propagate

    def bucket_user(self, bucket: str) -> dict[str, str]:
        """A new IAM user of the server allowed ``bucket`` only; returns the object_store
        options that read it with that user's own access key (enforced only inside
        :func:`authenticated`)."""
        import json

        import boto3

        iam = boto3.client("iam", endpoint_url=self.endpoint, region_name=REGION,
                           aws_access_key_id=ACCESS_KEY_ID,
                           aws_secret_access_key=SECRET_ACCESS_KEY)
        name = f"reader-{bucket}"
        iam.create_user(UserName=name)
        iam.put_user_policy(UserName=name, PolicyName="own-bucket", PolicyDocument=json.dumps({
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "s3:*",
                           "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]}]}))
        key = iam.create_access_key(UserName=name)["AccessKey"]
        return {**self.storage_options, "aws_access_key_id": key["AccessKeyId"],
                "aws_secret_access_key": key["SecretAccessKey"]}

    def new_bucket(self) -> str:
        name = f"t{next(self._count)}-{uuid.uuid4().hex[:8]}"
        self.client().create_bucket(Bucket=name)
        return name

    def objects(self, bucket: str) -> dict[str, bytes]:
        """Every object of ``bucket``: key → bytes."""
        client = self.client()
        found = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for item in page.get("Contents", ()):
                body = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
                found[item["Key"]] = body
        return found


@dataclass(frozen=True)
class S3Location:
    """A fresh bucket of the test server: the table URI, its options, the bucket."""

    server: S3Server
    bucket: str

    def uri(self, path: str = "t") -> str:
        return f"s3://{self.bucket}/{path}"

    @property
    def storage_options(self) -> dict[str, str]:
        return self.server.storage_options


@contextlib.contextmanager
def authenticated() -> Iterator[None]:
    """While the block runs, the server checks every request's signature and its user's
    policies (moto's IAM authentication: :meth:`S3Server.bucket_user`'s keys work, each on
    its own bucket; unknown keys and other buckets are refused). Process-wide in moto, so
    only for a test that runs alone in its process's server (tests run one at a time)."""
    from moto import settings
    from moto.core.authorization import ActionAuthenticatorMixin

    before = settings.INITIAL_NO_AUTH_ACTION_COUNT, ActionAuthenticatorMixin.request_count
    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0
    ActionAuthenticatorMixin.request_count = 0
    try:
        yield
    finally:
        settings.INITIAL_NO_AUTH_ACTION_COUNT, ActionAuthenticatorMixin.request_count = before

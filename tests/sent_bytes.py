"""Bytes an S3-protocol test server sends, counted at the server: :class:`SentBytes`, a WSGI
wrapper around moto's application (tests/s3.py installs it; bench/s3_requests.py too)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote


class SentBytes:
    """Counts the body bytes moto's server sends for object ``GET`` requests: a WSGI
    wrapper around its application (installed by :meth:`install`), which a test or bench
    watches per bucket."""

    def __init__(self, app: Any) -> None:
        self._app = app
        self._watchers: list[tuple[str, list[tuple[str, int]]]] = []
        self._guard = threading.Lock()

    @classmethod
    def install(cls, server: Any) -> SentBytes:
        """Wrap the application of a started ``ThreadedMotoServer``."""
        wsgi = server._server  # werkzeug's server: it calls .app for each request
        sent = cls(wsgi.app)
        wsgi.app = sent
        return sent

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        parts = unquote(environ.get("PATH_INFO", "")).lstrip("/").split("/", 1)
        is_object_get = (environ.get("REQUEST_METHOD") == "GET" and len(parts) == 2
                         and parts[1] != "")
        body: Iterator[bytes] = self._app(environ, start_response)
        if not is_object_get or not self._watchers:
            return body
        chunks = list(body)
        size = sum(len(c) for c in chunks)
        with self._guard:
            for bucket, seen in self._watchers:
                if bucket == parts[0]:
                    seen.append((parts[1], size))
        return iter(chunks)

    @contextlib.contextmanager
    def watch(self, bucket: str) -> Iterator[list[tuple[str, int]]]:
        """(key, bytes sent) of each object ``GET`` answered for ``bucket`` in the block."""
        seen: list[tuple[str, int]] = []
        entry = (bucket, seen)
        with self._guard:
            self._watchers.append(entry)
        try:
            yield seen
        finally:
            with self._guard:
                self._watchers.remove(entry)

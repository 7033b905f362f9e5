"""A real misbehaving S3 store for the tests: an HTTP proxy on loopback in front of moto.

Some S3-compatible stores (older MinIO, Ceph RGW, appliances) accept ``If-None-Match: *`` and
``If-Match`` and ignore them; networks lose responses; stores refuse a request now and then.
The proxy makes the session's moto server (tests/s3.py) behave so, over real HTTP, so the
engine meets the failure through its real client (obstore) and nothing of ours is mocked:

* ``ignore_conditions``: the conditional headers are removed before moto sees the request,
  so every conditional write succeeds and replaces what was there (a store that ignores them);
* :meth:`S3Proxy.lose_response`: the next request matching a method and a key suffix is
  forwarded, moto acts on it, and the connection is closed without an answer (a response lost
  on the way back, after which a client retries);
* :meth:`S3Proxy.refuse`: the next ``times`` requests matching a method and a key suffix are
  answered ``403 AccessDenied`` without reaching moto (a request that fails and is not retried
  by the client).

It runs in a thread of the test process (port chosen by the OS, 127.0.0.1 only); writer
processes that the tests start reach it by its endpoint like any store.
"""

from __future__ import annotations

import http.client
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit
from xml.sax.saxutils import unescape

_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
        "upgrade", "content-length"}
_CONDITIONS = {"if-none-match", "if-match"}
_KEY = re.compile(r"<Key>(.*?)</Key>", re.S)

_DENIED = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
           b"<Message>Access Denied (refused by the test proxy)</Message></Error>")


@dataclass
class _Rule:
    method: str
    suffix: str
    times: int
    after: int = 0


class S3Proxy:
    """The proxy: ``endpoint`` to use instead of the server's, and the requests it saw."""

    def __init__(self, upstream: str, *, ignore_conditions: bool = False) -> None:
        parts = urlsplit(upstream)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.ignore_conditions = ignore_conditions
        self.seen: list[tuple[str, str]] = []
        """(method, key) of every request, ``LIST`` with the prefix for a listing."""
        self._lose: list[_Rule] = []
        self._refuse: list[_Rule] = []
        self._guard = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def _forward(self) -> None:
                proxy._handle(self)

            do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="s3-proxy")
        self._thread.start()
        host, port = self._server.server_address[:2]
        self.endpoint = f"http://{host}:{port}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def lose_response(self, method: str, suffix: str, times: int = 1) -> None:
        """Forward the next ``times`` ``method`` requests whose key ends with ``suffix``, then
        close the connection without answering."""
        with self._guard:
            self._lose.append(_Rule(method, suffix, times))

    def refuse(self, method: str, suffix: str, times: int = 1, *, after: int = 0) -> None:
        """Answer the next ``times`` ``method`` requests whose key ends with ``suffix`` with
        403 AccessDenied, without forwarding them; ``after``: let that many pass first."""
        with self._guard:
            self._refuse.append(_Rule(method, suffix, times, after))

    @contextmanager
    def counting(self) -> Iterator[list[tuple[str, str]]]:
        """The requests seen while the block runs."""
        start = len(self.seen)
        found: list[tuple[str, str]] = []
        try:
            yield found
        finally:
            found.extend(self.seen[start:])

    def _take(self, rules: list[_Rule], method: str, key: str) -> bool:
        with self._guard:
            for rule in rules:
                if rule.times > 0 and rule.method == method and key.endswith(rule.suffix):
                    if rule.after > 0:
                        rule.after -= 1
                        continue
                    rule.times -= 1
                    return True
        return False

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        method = handler.command
        target = handler.path
        path, _, query = target.partition("?")
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        if method == "POST" and "delete" in query:  # DeleteObjects: the keys are in the body
            requests = [("DELETE", unescape(k)) for k in _KEY.findall(body.decode())]
        elif method == "GET" and "list-type" in query:
            requests = [("LIST", unquote(parse_qs(query).get("prefix", [""])[0]))]
        else:
            requests = [(method, unquote(path.lstrip("/").partition("/")[2]))]
        with self._guard:
            self.seen.extend(requests)
        if any(self._take(self._refuse, m, k) for m, k in requests):
            handler.send_response(403)
            handler.send_header("Content-Type", "application/xml")
            handler.send_header("Content-Length", str(len(_DENIED)))
            handler.end_headers()
            handler.wfile.write(_DENIED)
            return
        headers = {name: value for name, value in handler.headers.items()
                   if name.lower() not in _HOP
                   and not (self.ignore_conditions and name.lower() in _CONDITIONS)}
        upstream = http.client.HTTPConnection(*self._upstream, timeout=60)
        try:
            upstream.request(method, target, body=body if method in ("PUT", "POST") else None,
                             headers={**headers, "Content-Length": str(len(body))})
            response = upstream.getresponse()
            payload = response.read()
            answer = [(n, v) for n, v in response.getheaders()
                      if n.lower() not in (*_HOP, "server", "date")]
            size = (response.getheader("Content-Length") or "0" if method == "HEAD"
                    else str(len(payload)))
            status = response.status
        finally:
            upstream.close()
        if any(self._take(self._lose, m, k) for m, k in requests):
            handler.close_connection = True  # moto acted; the answer never arrives
            return
        handler.send_response(status)
        for name, value in answer:
            handler.send_header(name, value)
        handler.send_header("Content-Length", size)
        handler.end_headers()
        if method != "HEAD":
            handler.wfile.write(payload)

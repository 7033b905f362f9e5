"""Checks every object store's suite runs the same way (S3: test_object_storage.py; GCS and
Azure: test_cloud_stores.py): the rows they write, a read judged by the oracle and hudi-rs, and
eight writers racing to create one timeline file."""

from __future__ import annotations

import threading
from collections.abc import Mapping

import pyarrow as pa

from engine import Table
from engine.storage import Storage
from tests.helpers import Oracle, hudi_rs_read, sorted_rows

SCHEMA = pa.schema([("key", pa.string()), ("ts", pa.int64()), ("region", pa.string()),
                    ("fare", pa.float64())])
COLUMNS = ["key", "ts", "region", "fare"]


def region_rows(keys: range, ts: int) -> list[dict[str, object]]:
    """Rows of :data:`SCHEMA` for ``keys``, two regions, values depending on ``ts``."""
    return [{"key": f"k{i:03d}", "ts": ts, "region": ("eu", "us")[i % 2], "fare": i * 1.5 + ts}
            for i in keys]


def check_read(table: Table, oracle: Oracle, storage_options: Mapping[str, str]) -> None:
    """The table read by the engine and by hudi-rs (same storage options) = the oracle."""
    expected = sorted_rows(oracle.rows.values(), COLUMNS)
    assert sorted_rows(table.read(), COLUMNS) == expected
    assert sorted_rows(hudi_rs_read(table.path, storage_options=storage_options),
                       COLUMNS) == expected


def assert_exactly_one_create_wins(location: str, storage_options: Mapping[str, str]) -> None:
    """Eight writers (own storages) create the same completed-instant file at once: exactly
    one wins, the others get FileExistsError, and the file holds the winner's bytes."""
    storages = [Storage(location, dict(storage_options)) for _ in range(8)]
    outcomes: list[str] = []
    barrier = threading.Barrier(len(storages))

    def complete(i: int) -> None:
        barrier.wait()
        try:
            storages[i].write_new(".hoodie/timeline/20260101000000000_x.commit",
                                  f"writer {i}".encode())
            outcomes.append(f"won {i}")
        except FileExistsError:
            outcomes.append("lost")

    threads = [threading.Thread(target=complete, args=(i,)) for i in range(len(storages))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [o for o in outcomes if o.startswith("won")]
    assert len(winners) == 1 and outcomes.count("lost") == len(storages) - 1
    content = storages[0].read(".hoodie/timeline/20260101000000000_x.commit")
    assert content == f"writer {winners[0].split()[1]}".encode()

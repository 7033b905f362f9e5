"""Requests per commit on an S3 table, counted at the server, with and without the metadata
table; and what a one-column, one-partition read fetches.

Starts moto's S3-protocol server on loopback in this process (``pip install 'moto[server]'``),
creates one table per mode, loads it, then runs ``--commits`` upserts and counts the HTTP
requests the server received during each (by kind: GET, HEAD, PUT, DELETE, LIST, POST), from
the server's own request log. Prints the median per commit. Not a speed benchmark: the
figures are request counts, which is what an object store bills and what its latency
multiplies.

Then the read rows: a table of ``--read-rows`` rows (the same 4 partitions; compacted when
merge-on-read, so each slice is a base file) read as ``Table.read(["v"], part = p3)``,
first in a process that has seen no footer of the table (cold), then again (warm), and read
whole (``Table.read()``), and the same one-column query through the Spark source
(``spark.read.format("tidelake")`` with ``tidelake.read.columns`` and
``tidelake.read.filters``, a local Spark session; ``--no-spark``: not): the requests, and the
bytes of base files the server sent (tests/s3.py counts each answer's body) against the bytes
of the chunks of ``v`` (the column asked) and of ``part`` (the filter's), and of the files'
footers.
"""

from __future__ import annotations

import argparse
import logging
import random
import re
import statistics
import sys
import uuid
from collections import Counter
from collections.abc import Callable, Sized
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import DataFrameReader

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run from a checkout: make `engine` importable
    sys.path.insert(0, str(REPO_ROOT))

_REQUEST = re.compile(r'"(?:\x1b\[[0-9;]*m)*(GET|PUT|HEAD|DELETE|POST) (\S+) HTTP')


class _Counter(logging.Handler):
    """Counts the requests werkzeug (moto's server) logs, by kind."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        match = _REQUEST.search(record.getMessage())
        if match is None:
            return
        method, target = match.groups()
        kind = "LIST" if method == "GET" and ("list-type" in target or "prefix=" in target) \
            else method
        self.counts[kind] += 1


def _batch(rng: random.Random, start: int, size: int, existing: int) -> pa.Table:
    keys = [f"k{rng.randrange(existing):08d}" for _ in range(size // 2)]
    keys += [f"k{start + i:08d}" for i in range(size - len(keys))]
    keys = list(dict.fromkeys(keys))
    return pa.table({"key": keys, "ts": [start] * len(keys),
                     "part": [f"p{int(k[1:]) % 4}" for k in keys],
                     "v": [rng.random() for _ in keys]})


def _chunk_bytes(data: bytes, columns: list[str]) -> tuple[int, int]:
    """Bytes of the chunks of ``columns`` in a parquet file, and of its footer."""
    import pyarrow.parquet as pq

    metadata = pq.ParquetFile(pa.BufferReader(data)).metadata
    chunks = 0
    for group in range(metadata.num_row_groups):
        for leaf in range(metadata.num_columns):
            if metadata.schema.column(leaf).path in columns:
                chunks += metadata.row_group(group).column(leaf).total_compressed_size
    return chunks, int.from_bytes(data[-8:-4], "little") + 8


def read_rows(args: argparse.Namespace, client: object, options: dict[str, str],
              counter: _Counter, sent: object) -> None:
    """The read rows (module doc)."""
    from engine import Table

    bucket = f"bench-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)  # type: ignore[attr-defined]
    table = Table.create(f"s3://{bucket}/t", name="bench", table_type=args.table_type,
                         record_key="key", precombine="ts", partition_by="part",
                         options={"hoodie.index.type": args.index},
                         storage_options=options)
    rng = random.Random(11)
    table.bulk_insert(_batch(rng, 0, args.read_rows, 1))
    table.upsert(_batch(rng, args.read_rows, args.batch_size, args.read_rows))
    if args.table_type == "MERGE_ON_READ":
        table.compact()
    query: dict[str, object] = {"columns": ["v"], "filters": [("part", "=", "p3")]}
    scan = table.scan(**query)  # type: ignore[arg-type]
    v_chunks = part_chunks = footers = whole = 0
    for slc in scan.slices:
        assert slc.base_file is not None and not slc.log_files
        data = client.get_object(  # type: ignore[attr-defined]
            Bucket=bucket, Key=f"t/{slc.base_file.path}")["Body"].read()
        v, footer = _chunk_bytes(data, ["v"])
        part, _ = _chunk_bytes(data, ["part"])
        v_chunks, part_chunks, footers, whole = (v_chunks + v, part_chunks + part,
                                                 footers + footer, whole + len(data))
    print(f"\nread of v where part = p3: {len(scan.slices)} base files, {whole:,} bytes; "
          f"chunks of v {v_chunks:,}, of part {part_chunks:,}, footers {footers:,} bytes")
    print(f"{'read':<22} {'requests':>8} {'base GETs':>9} {'base bytes':>11} "
          f"{'/ v chunks':>10} {'/ v+part+footers':>16}")
    reads: list[tuple[str, Callable[[], Sized], bool]] = [
        ("one column, cold", lambda: table.read(**query), True),  # type: ignore[arg-type]
        ("one column, warm", lambda: table.read(**query), True),  # type: ignore[arg-type]
        ("whole table", table.read, False)]
    if args.spark:
        reads += _spark_reads(table.path, options)
    for label, read, one_column in reads:
        counter.counts.clear()
        with sent.watch(bucket) as got:  # type: ignore[attr-defined]
            rows = read()
        base = [size for key, size in got if key.endswith(".parquet")]
        requests = sum(counter.counts.values())
        fetched = sum(base)
        needed = v_chunks + part_chunks + footers
        ratios = (f"{fetched / v_chunks:>10.2f} {fetched / needed:>16.2f}" if one_column
                  else f"{'':>10} {'':>16}")
        print(f"{label:<22} {requests:>8} {len(base):>9} {fetched:>11,} {ratios}"
              f"  ({len(rows):,} rows)")


def _spark_reads(path: str, options: dict[str, str]
                 ) -> list[tuple[str, Callable[[], Sized], bool]]:
    """The engine's one-column query through the Spark source: ``format("tidelake")`` with
    ``tidelake.read.columns`` and ``tidelake.read.filters``, and (as before them) with the
    query in Spark's ``WHERE`` and ``SELECT`` alone; the store's options on the read. Its
    tasks run in Spark's Python workers, fresh processes (no footer seen). The session
    starts here, outside the counted reads."""
    from common import local_spark

    from ingest.spark_read import register

    spark = local_spark("tidelake-s3-requests")
    register(spark)

    def reader(**read: str) -> DataFrameReader:
        made = spark.read.format("tidelake")
        for key, value in {**options, **read}.items():
            made = made.option(key, value)
        return made

    pruned = reader(**{"tidelake.read.columns": "v",
                       "tidelake.read.filters": '[["part", "=", "p3"]]'})
    return [("Spark, read options", lambda: pruned.load(path).collect(), True),
            ("Spark, WHERE only", lambda: reader().load(path).where("part = 'p3'")
             .select("v").collect(), True)]


def run(args: argparse.Namespace) -> None:
    import boto3  # type: ignore[import-untyped]
    from moto.server import ThreadedMotoServer

    from engine import Table
    from tests.sent_bytes import SentBytes

    counter = _Counter()
    werkzeug = logging.getLogger("werkzeug")
    werkzeug.setLevel(logging.INFO)
    werkzeug.addHandler(counter)
    werkzeug.propagate = False
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=True)
    server.start()
    sent = SentBytes.install(server)
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    options = {"aws_endpoint_url": endpoint, "aws_allow_http": "true",
               "aws_region": "us-east-1", "aws_access_key_id": "bench",
               "aws_secret_access_key": "bench"}
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="bench", aws_secret_access_key="bench")
    print(f"{args.commits} upserts of {args.batch_size} rows after a load of {args.rows} rows; "
          f"{args.table_type}, index {args.index}, 4 partitions; requests counted at the "
          "server (moto on loopback)")
    print(f"{'metadata table':<16} {'median':>7}  per kind (median per commit)")
    try:
        for mdt in () if args.reads_only else ("true", "false"):
            bucket = f"bench-{uuid.uuid4().hex[:12]}"
            client.create_bucket(Bucket=bucket)
            table = Table.create(f"s3://{bucket}/t", name="bench", table_type=args.table_type,
                                 record_key="key", precombine="ts", partition_by="part",
                                 options={"hoodie.metadata.enable": mdt,
                                          "hoodie.index.type": args.index},
                                 storage_options=options)
            rng = random.Random(7)
            table.bulk_insert(_batch(rng, 0, args.rows, 1))
            totals: list[int] = []
            kinds: dict[str, list[int]] = {}
            for i in range(args.commits):
                counter.counts.clear()
                table.upsert(_batch(rng, args.rows + i * args.batch_size, args.batch_size,
                                    args.rows))
                counts = dict(counter.counts)
                totals.append(sum(counts.values()))
                for kind in ("GET", "HEAD", "LIST", "PUT", "DELETE", "POST"):
                    kinds.setdefault(kind, []).append(counts.get(kind, 0))
            per_kind = ", ".join(f"{k} {statistics.median(v):g}" for k, v in kinds.items()
                                 if any(v))
            label = "on" if mdt == "true" else "off"
            print(f"{label:<16} {statistics.median(totals):>7g}  {per_kind}")
        if args.read_rows:
            read_rows(args, client, options, counter, sent)
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20_000, help="initial load (20,000)")
    parser.add_argument("--commits", type=int, default=5, help="upserts counted (5)")
    parser.add_argument("--batch-size", type=int, default=2_000, help="rows per upsert")
    parser.add_argument("--table-type", default="MERGE_ON_READ",
                        choices=("MERGE_ON_READ", "COPY_ON_WRITE"))
    parser.add_argument("--index", default="BUCKET", help="hoodie.index.type (BUCKET)")
    parser.add_argument("--read-rows", type=int, default=200_000,
                        help="rows of the read rows' table (200,000; 0: no read rows)")
    parser.add_argument("--reads-only", action="store_true",
                        help="only the read rows (no upserts counted)")
    parser.add_argument("--no-spark", dest="spark", action="store_false",
                        help="no read row of the Spark source (it starts a local Spark)")
    run(parser.parse_args())


if __name__ == "__main__":
    main()

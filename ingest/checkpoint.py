"""What a streaming commit records about its micro-batch, and reading it back.

Every commit the sink makes carries, in its ``extraMetadata`` (driver side only):

* ``_hudi_streaming_sink_checkpoint`` — Hudi's streaming-sink checkpoint, in Hudi 1.x's JSON
  form ``{"<writer identifier>": "<batch id>"}`` (``CommitUtils.getCheckpointValueAsString``;
  the identifier is Hudi's ``hoodie.datasource.write.streaming.checkpoint.identifier``);
* ``tidelake.streaming.query.id`` — the Spark query id (stable across restarts from the same
  checkpoint, new for a new checkpoint). Batch ids restart at 0 when a query starts over
  without its checkpoint; comparing batch ids only within one query id keeps such a query from
  skipping its first batches as "already committed";
* the Kafka offsets the table now covers — the next offset to read per partition, as Hudi's
  streamer writes them (``topic,partition:offset,...``; topics joined by ``;``), under
  ``streamer.checkpoint.key`` and under Hudi's own key ``deltastreamer.checkpoint.key``
  (``StreamerCheckpointV1``), so a Hudi streamer can take the table over.

A batch is *already committed* when the latest commit of the same writer identifier and query
id has a batch id at least as large: the sink then writes nothing (exactly once on replay).
:func:`starting_offsets_from_table` turns the offsets back into ``startingOffsets`` for a job
whose Spark checkpoint was lost.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.errors import CorruptTableError, TableNotFoundError
from engine.write.distributed import Timeline
from ingest.kafka_offsets import (
    format_hudi_checkpoint,
    offsets_from_json_dict,
    parse_hudi_checkpoint,
)
from ingest.sink_config import DEFAULT_IDENTIFIER

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "CHECKPOINT_KEYS",
    "DEFAULT_IDENTIFIER",
    "HUDI_STREAMER_CHECKPOINT_KEY",
    "QUERY_ID_KEY",
    "SINK_CHECKPOINT_KEY",
    "STREAMER_CHECKPOINT_KEY",
    "CommittedBatch",
    "batch_end_offsets",
    "checkpoint_metadata",
    "last_committed_batch",
    "last_offsets",
    "merge_offsets",
    "starting_offsets_from_table",
]

log = logging.getLogger(__name__)

SINK_CHECKPOINT_KEY = "_hudi_streaming_sink_checkpoint"
"""Hudi's ``HoodieStreamingSink.SINK_CHECKPOINT_KEY``."""
QUERY_ID_KEY = "tidelake.streaming.query.id"
STREAMER_CHECKPOINT_KEY = "streamer.checkpoint.key"
HUDI_STREAMER_CHECKPOINT_KEY = "deltastreamer.checkpoint.key"
"""``StreamerCheckpointV1.STREAMER_CHECKPOINT_KEY_V1``: the key Hudi's streamer reads."""
HUDI_STREAMER_CHECKPOINT_KEY_V2 = "streamer.checkpoint.key.v2"
"""Hudi 1.x's V2 key; read (Kafka offsets in the same form), never written."""
_QUERY_ID_PROPERTY = "sql.streaming.queryId"  # Spark's StreamExecution.QUERY_ID_KEY
_OFFSET_KEYS = (STREAMER_CHECKPOINT_KEY, HUDI_STREAMER_CHECKPOINT_KEY_V2,
                HUDI_STREAMER_CHECKPOINT_KEY)

CHECKPOINT_KEYS = (SINK_CHECKPOINT_KEY, QUERY_ID_KEY, STREAMER_CHECKPOINT_KEY,
                   HUDI_STREAMER_CHECKPOINT_KEY)
"""What a streaming commit records; table-service commits carry these forward
(``hoodie.write.rolling.metadata.keys``)."""

Offsets = dict[str, dict[int, int]]


@dataclass(frozen=True)
class CommittedBatch:
    """The last micro-batch a writer committed: its batch id, query id and instant."""

    batch_id: int
    query_id: str | None
    instant_time: str


def _newest_first(timeline: Timeline) -> Iterator[tuple[str, Mapping[str, str]]]:
    for instant in reversed(timeline.completed_data_instants):
        meta = timeline.commit_metadata(instant)
        yield instant.requested_time, meta.extra_metadata


def _batch_of(instant_time: str, extra: Mapping[str, str], identifier: str) -> int | None:
    raw = extra.get(SINK_CHECKPOINT_KEY)
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        raise CorruptTableError(
            f"commit {instant_time}: {SINK_CHECKPOINT_KEY} is not JSON: {raw!r}") from None
    if not isinstance(value, dict) or identifier not in value:
        return None
    try:
        return int(value[identifier])
    except (TypeError, ValueError):
        raise CorruptTableError(f"commit {instant_time}: {SINK_CHECKPOINT_KEY} holds no "
                                f"batch id for {identifier!r}: {raw!r}") from None


def last_committed_batch(timeline: Timeline, identifier: str,
                         query_id: str | None = None) -> CommittedBatch | None:
    """The newest commit carrying a batch id for ``identifier`` — of query ``query_id`` when
    one is given, so that another writer's commits (a second job, a backfill) never hide
    this query's own — or None if there is none."""
    for instant_time, extra in _newest_first(timeline):
        batch_id = _batch_of(instant_time, extra, identifier)
        if batch_id is None:
            continue
        if query_id is not None and extra.get(QUERY_ID_KEY) not in (None, query_id):
            continue
        return CommittedBatch(batch_id, extra.get(QUERY_ID_KEY), instant_time)
    return None


def is_committed(last: CommittedBatch | None, batch_id: int, query_id: str | None) -> bool:
    """True if ``batch_id`` of query ``query_id`` is already in the table (skip it)."""
    if last is None or last.batch_id < batch_id:
        return False
    if last.query_id != query_id:
        log.info("batch %d of query %s: the table's last streaming commit (%s) is batch %d of "
                 "query %s, another query; not skipped", batch_id, query_id, last.instant_time,
                 last.batch_id, last.query_id)
        return False
    return True


def last_offsets(timeline: Timeline, identifier: str | None = None) -> Offsets | None:
    """Kafka offsets (next to read) recorded by the newest commit that has any — the newest
    of writer ``identifier`` when one is given (each streaming job records its own)."""
    for instant_time, extra in _newest_first(timeline):
        if identifier is not None and _batch_of(instant_time, extra, identifier) is None:
            continue
        for key in _OFFSET_KEYS:
            raw = extra.get(key)
            if raw:
                try:
                    return parse_hudi_checkpoint(raw)
                except ValueError:
                    raise CorruptTableError(
                        f"commit {instant_time}: {key} is not a Kafka checkpoint: {raw!r}"
                    ) from None
    return None


def merge_offsets(previous: Offsets | None, batch_max: Mapping[tuple[str, int], int],
                  planned: Offsets | None = None) -> Offsets:
    """Next offsets after a batch, over ``previous``: ``planned`` (the batch's end offsets,
    :func:`batch_end_offsets`) for every partition it names, else the batch's max offset + 1.

    A batch covers ``[start, planned end)`` of every partition, whether or not a record came
    from it: a partition it read nothing from (its range empty, or only control records)
    resumes at its planned end too, so every recorded offset is exactly "after what was read".
    That end can be below ``previous``: a batch starts where the last one ended, so it ends
    lower only after the source accepted that the partition's offsets went back (topic
    recreated, ``failOnDataLoss=false``), and keeping the old, higher offset would make a job
    resuming from the table skip the new log's records up to it. Without ``planned`` (a batch
    not run by a streaming query) partitions the batch did not read keep their previous
    offset. A record at or past its partition's planned end raises ValueError: no offset
    outside the batch is ever recorded. (A replayed batch reads the same ranges as before,
    and an already committed one is not written again.)
    """
    merged: Offsets = {t: dict(parts) for t, parts in (previous or {}).items()}
    for (topic, partition), offset in batch_max.items():
        end = (planned or {}).get(topic, {}).get(partition)
        if end is not None and offset >= end:
            raise ValueError(f"topic '{topic}' partition {partition}: the batch holds offset "
                             f"{offset}, past its planned end {end}")
        merged.setdefault(topic, {})[partition] = int(offset) + 1
    for topic, parts in (planned or {}).items():
        merged.setdefault(topic, {}).update(parts)
    return merged


def batch_end_offsets(spark: SparkSession, batch_id: int) -> Offsets | None:
    """Driver, inside ``foreachBatch``: the end offsets of micro-batch ``batch_id`` of the
    running query, as Spark wrote them to its offset log before running the batch (so a
    replayed batch gets the same ones), for every Kafka-shaped source of the query (ours and
    Spark's ``kafka``; other sources are left out).

    None when the batch is not run by a streaming query of this session, or when Spark's
    offset log cannot be reached (logged): the caller then records what the batch read.
    The offset log is Spark's internal ``StreamExecution.offsetLog`` (``OffsetSeqBase.offsets``,
    Spark 3.x and 4.x), reached through Py4J and the session's ``activeStreamingQueries``.
    """
    query_id = spark.sparkContext.getLocalProperty(_QUERY_ID_PROPERTY)
    jvm = spark._jvm
    if not query_id or jvm is None:
        return None
    try:
        # foreachBatch gets a clone of the session that started the query, with a query
        # manager of its own; the running queries of every session are in the shared state.
        running = spark._jsparkSession.sharedState().activeStreamingQueries()
        execution = running.get(jvm.java.util.UUID.fromString(query_id))
        entry = None if execution is None else execution.offsetLog().get(batch_id)
        if entry is None or not entry.isDefined():
            return None
        sources = entry.get().offsets()
        texts = [sources.apply(i) for i in range(sources.length())]
        texts = [o.get().json() for o in texts if o.isDefined()]
    except Exception:  # Spark's internals changed
        log.warning("batch %d: cannot read the query's offset log; the table's checkpoint "
                    "records what the batch read", batch_id, exc_info=True)
        return None
    ends: Offsets = {}
    for text in texts:
        try:
            offsets = offsets_from_json_dict(json.loads(text))
        except (ValueError, TypeError, AttributeError):
            continue  # not a Kafka source
        for topic, parts in offsets.items():
            ends.setdefault(topic, {}).update(parts)
    return ends


def checkpoint_metadata(identifier: str, batch_id: int, query_id: str | None,
                        offsets: Offsets | None) -> dict[str, str]:
    """The ``extraMetadata`` entries of a streaming commit."""
    extra = {SINK_CHECKPOINT_KEY: json.dumps({identifier: str(batch_id)},
                                             separators=(",", ":"))}
    if query_id:
        extra[QUERY_ID_KEY] = query_id
    if offsets:
        text = format_hudi_checkpoint(offsets)
        extra[STREAMER_CHECKPOINT_KEY] = text
        extra[HUDI_STREAMER_CHECKPOINT_KEY] = text
    return extra


def starting_offsets_from_table(table_path: str, identifier: str | None = None, *,
                                storage_options: Mapping[str, str] | None = None
                                ) -> Offsets | None:
    """Offsets to resume from: those the table's newest streaming commit recorded.

    For a job whose Spark checkpoint is lost while the table exists: pass
    ``ingest.kafka_source.starting_offsets_json(result)`` as the source's ``startingOffsets``.
    Returns None when there is no table at ``table_path`` or no commit with offsets.
    """
    from engine.table import Table

    try:
        table = Table.open(table_path, storage_options=storage_options)
    except TableNotFoundError:
        return None
    return last_offsets(Timeline.load(table.storage, table.config), identifier)

"""Where each Kafka partition's readable log ends: the driver's look-up before it plans a batch.

:func:`probe_ends` costs one ListOffsets request and one Fetch request per partition leader,
whatever the production rate, and decodes no record:

1. ListOffsets (latest) gives each partition a *listed* end. On Apache Kafka it is exact: the
   high watermark, or under ``read_committed`` the last stable offset. On Tansu 0.6 (the
   embedded test broker) it is only a lower bound: the last batch's base offset + 1 when the
   last produce request carried several records, and 0 under ``read_committed`` while a
   transaction is open (``docs/ingest.md``).
2. One Fetch per leader, at ``max(listed, floor)`` for each of its partitions (``floor``:
   offsets known to exist, the batch's start), asking for one byte (``max_bytes=1``): a
   broker still answers with the first record batch it has there, whole (KIP-74), so an answer
   carries at most one batch, and none when nothing was produced since the listing. The
   records are never decoded; what the answer says is read: its high watermark
   (``read_uncommitted``) or last stable offset (``read_committed``) is where the readable log
   ends at that moment. On Kafka that is what ListOffsets answered, or later; on Tansu it is
   exact where ListOffsets is not (measured: after 1 + 300 + 5 + 5 records in four requests
   ListOffsets lists 307, the Fetch answer says 311; with a transaction open it lists 0 under
   ``read_committed`` while the Fetch answer's last stable offset is the transaction's first
   offset). So one rule is right on both, and no probe chases a moving end: records produced
   after the answer are the next batch's.
3. The end is ``max(fetch offset, that watermark)``: every offset below it was listed or
   answered by the leader, so a read task can read it (an offset hole there, which Tansu
   shows while a later batch is visible before an earlier one, is waited for by the task).

``beyond``: the leader answered that the fetch offset lies past its log end
(OFFSET_OUT_OF_RANGE on Kafka; on Tansu, which answers a fetch past the end with nothing, a
high watermark below the fetch offset) - evidence that the log went back. A partition without
an answer (no leader known, a failed request, an error code other than OFFSET_OUT_OF_RANGE)
ends at its fetch offset, unconfirmed: those offsets exist, and the next batch asks again.

The Fetch request goes through the driver consumer's own connections (kafka-python 3's
connection manager, as its fetcher sends them); no consumer position, fetch session or
partition state is used or changed, so nothing an earlier call left behind is taken for this
call's answer.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.errors import TerminalError
from ingest.kafka_offsets import TopicPart

__all__ = ["FETCH_WAIT_MS", "KafkaClientError", "PartitionEnd", "Watermarks", "fetch_watermarks",
           "probe_ends"]

log = logging.getLogger("ingest.kafka_source")

FETCH_WAIT_MS = 20
"""``max_wait_ms`` of the probe's Fetch. Kafka answers at once (``min_bytes=0``); Tansu 0.6
answers a Fetch with ``max_wait_ms=0`` without any partition, so the probe waits this long at
most."""
_FETCH_TIMEOUT_MS = 10_000  # a leader that does not answer: ends unconfirmed, asked again next
_MAX_FETCH_VERSION = 12  # v13 names topics by id only (kafka-python's fetcher sends <= 12 too)
_OFFSET_OUT_OF_RANGE = 1


class KafkaClientError(TerminalError):
    """The installed kafka-python lacks what the source's driver needs (names the version)."""


@dataclass(frozen=True)
class PartitionEnd:
    """What the driver learned about where a partition's readable log ends.

    ``offset``: every offset below it is readable or already read (it is never more than the
    broker showed); ``confirmed``: the partition's leader answered the probe's fetch, so
    ``offset`` is where the log ended at that moment (the last stable offset under
    ``read_committed``); ``beyond``: the leader answered that the fetch offset lies past its
    log end (OFFSET_OUT_OF_RANGE, or a high watermark below it) - evidence that the log went
    back, and ``offset`` is then that end.
    """

    offset: int
    confirmed: bool
    beyond: bool = False


@dataclass(frozen=True)
class Watermarks:
    """One partition's part of a Fetch answer, records left out."""

    error: int
    high_watermark: int
    last_stable_offset: int


def probe_ends(consumer: Any, tps: Mapping[TopicPart, Any], floor: Mapping[TopicPart, int],
               read_committed: bool) -> dict[TopicPart, PartitionEnd]:
    """Where each of ``tps`` (``(topic, partition)`` -> kafka-python ``TopicPartition``) ends;
    see the module docstring. ``floor``: offsets known to exist (already read)."""
    listed = consumer.end_offsets(list(tps.values()))
    at = {key: max(int(listed[tp]), int(floor.get(key, 0))) for key, tp in tps.items()}
    answers = fetch_watermarks(consumer, {tp: at[key] for key, tp in tps.items()},
                               read_committed)
    found: dict[TopicPart, PartitionEnd] = {}
    for key, tp in tps.items():
        answer = answers[tp]
        if isinstance(answer, Watermarks):
            stable = (answer.last_stable_offset
                      if read_committed and answer.last_stable_offset >= 0
                      else answer.high_watermark)
            if answer.error == _OFFSET_OUT_OF_RANGE:
                found[key] = PartitionEnd(int(listed[tp]), confirmed=True, beyond=True)
                continue
            if answer.error == 0 and 0 <= answer.high_watermark < at[key]:
                # Tansu answers a fetch past the log end with nothing (Kafka: the error above)
                found[key] = PartitionEnd(answer.high_watermark, confirmed=True, beyond=True)
                continue
            if answer.error == 0 and stable >= 0:
                found[key] = PartitionEnd(max(at[key], stable), confirmed=True)
                continue
            answer = _error_name(answer.error)
        log.info("topic '%s' partition %d: no end from its leader (%s); planning up to offset"
                 " %d, which it listed", key[0], key[1], answer, at[key])
        found[key] = PartitionEnd(at[key], confirmed=False)
    return found


def fetch_watermarks(consumer: Any, at: Mapping[Any, int], read_committed: bool
                     ) -> dict[Any, Watermarks | str]:
    """One Fetch request per leader of ``at``'s partitions (each at its offset, one byte
    asked for) through ``consumer``'s connections; each partition's watermarks, or why there
    are none (a few words)."""
    from kafka.errors import KafkaError

    try:
        from kafka.protocol.consumer import FetchRequest

        manager = consumer._manager
        cluster = manager.cluster
        topic_type = FetchRequest.FetchTopic
        partition_type = topic_type.FetchPartition
    except (ImportError, AttributeError) as exc:
        import kafka

        raise KafkaClientError(
            f"kafka-python {getattr(kafka, '__version__', '?')} is not what the Kafka source "
            f"was built on ({exc}): install kafka-python>=3.0,<4") from None
    out: dict[Any, Watermarks | str] = {}
    by_leader: dict[int, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    for tp, offset in at.items():
        leader = cluster.leader_for_partition(tp)
        if leader is None or leader == -1:
            cluster.request_update()
            out[tp] = "no leader known"
            continue
        by_leader[leader][tp.topic].append(partition_type(
            partition=tp.partition, current_leader_epoch=-1, fetch_offset=offset,
            last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1))
    isolation = 1 if read_committed else 0
    requests = {
        leader: FetchRequest(
            max_wait_ms=FETCH_WAIT_MS, min_bytes=0, max_bytes=1, isolation_level=isolation,
            session_id=0, session_epoch=-1,  # a full fetch outside any fetch session
            topics=[topic_type(topic=t, partitions=parts) for t, parts in topics.items()],
            forgotten_topics_data=[], rack_id="",
            min_version=FetchRequest.min_version_for_isolation_level(isolation),
            max_version=_MAX_FETCH_VERSION)
        for leader, topics in by_leader.items()}

    async def ask_all() -> dict[int, Any]:
        sent = {leader: manager.send(request, node_id=leader,
                                     request_timeout_ms=_FETCH_TIMEOUT_MS)
                for leader, request in requests.items()}
        answered: dict[int, Any] = {}
        for leader, future in sent.items():
            try:
                answered[leader] = await future
            except KafkaError as exc:
                answered[leader] = exc
        return answered

    responses = manager.run(ask_all) if requests else {}
    for leader, response in responses.items():
        if isinstance(response, Exception):
            for topic, parts in by_leader[leader].items():
                for part in parts:
                    out[_tp(topic, part.partition)] = f"fetch failed: {response!r}"
            continue
        for topic_data in response.responses:
            for data in topic_data.partitions:
                out[_tp(topic_data.topic, data.partition_index)] = Watermarks(
                    int(data.error_code), int(data.high_watermark),
                    int(getattr(data, "last_stable_offset", -1)))
    for tp in at:
        out.setdefault(tp, "the leader's answer left it out")
    return out


def _tp(topic: str, partition: int) -> Any:
    from kafka import TopicPartition

    return TopicPartition(topic, partition)


def _error_name(code: int) -> str:
    from kafka.errors import for_code

    return f"{for_code(code).__name__} (error {code})"

"""Kafka offsets: their checkpoint JSON, Hudi streamer checkpoints, and micro-batch planning.

Offsets are ``{"topic": {partition: next_offset}}`` (:data:`Offsets`); in Spark's checkpoint
and in ``startingOffsets`` the partition keys are strings (:func:`offsets_to_json_dict`).
Planning (:func:`plan_end_offsets`, :func:`split_limit`) depends on nothing but its
arguments, so a replayed batch gets the same ranges. The driver plans; executor tasks call
:func:`check_offset_range` before reading. No Spark and no Kafka client here:
:mod:`ingest.kafka_source` uses them and re-exports the names it had before the split.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any

from engine.errors import TerminalError

__all__ = [
    "KafkaDataLossError",
    "Offsets",
    "TopicPart",
    "check_offset_range",
    "flatten_offsets",
    "format_hudi_checkpoint",
    "is_topic_name",
    "nest_offsets",
    "offsets_from_json_dict",
    "offsets_to_json_dict",
    "parse_hudi_checkpoint",
    "plan_end_offsets",
    "report_data_loss",
    "split_limit",
    "starting_offsets_json",
]

# Data-loss warnings keep the source's logger name, so logging set up for it still applies.
log = logging.getLogger("ingest.kafka_source")

_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")

Offsets = dict[str, dict[int, int]]
"""Next offset to read per topic and partition."""
TopicPart = tuple[str, int]


class KafkaDataLossError(TerminalError):
    """Offsets the query needs are gone (retention, deleted or recreated topic)."""


class MissingTopicsError(TerminalError):
    """Subscribed topics do not exist on the cluster (found by the job's check before it
    starts, or by the source's driver when it lists partitions); ``topics`` names them."""

    def __init__(self, message: str, topics: list[str]) -> None:
        super().__init__(message)
        self.topics = topics


def is_topic_name(name: str) -> bool:
    """True for a legal Kafka topic name (1-249 of ``A-Z a-z 0-9 . _ -``)."""
    return _TOPIC_RE.match(name) is not None


def offsets_to_json_dict(offsets: Offsets) -> dict[str, dict[str, int]]:
    """The checkpoint form: string partition keys, topics and partitions in sorted order.

    Spark compares offsets by their JSON text, so the order must not depend on history.
    """
    return {t: {str(p): int(offsets[t][p]) for p in sorted(offsets[t])} for t in sorted(offsets)}


def offsets_from_json_dict(data: Any) -> Offsets:
    """Inverse of :func:`offsets_to_json_dict`; raises ValueError/TypeError on other shapes."""
    if not isinstance(data, dict):
        raise ValueError("offsets must be a JSON object of topics")
    out: Offsets = {}
    for topic, parts in data.items():
        if not isinstance(parts, dict):
            raise ValueError(f"offsets of topic '{topic}' must be an object of partitions")
        out[str(topic)] = {int(p): int(o) for p, o in parts.items()}
    return out


def starting_offsets_json(offsets: Mapping[str, Mapping[int, int]]) -> str:
    """``startingOffsets`` JSON resuming at ``offsets`` (next offset per topic and partition)."""
    return json.dumps(offsets_to_json_dict({t: dict(p) for t, p in offsets.items()}))


def parse_hudi_checkpoint(checkpoint: str) -> Offsets:
    """Parse Hudi's streamer checkpoint (``streamer.checkpoint.key``) into offsets.

    Hudi writes ``topic,partition:offset,partition:offset`` with the next offset to read per
    partition, one topic per string. Several topics are written as such strings joined by
    ``;`` (our extension: Kafka topic names cannot contain ``,``, ``:`` or ``;``).
    """
    out: Offsets = {}
    for part in checkpoint.strip().split(";"):
        topic, *pairs = [piece.strip() for piece in part.split(",")]
        if not is_topic_name(topic) or not pairs or topic in out:
            raise ValueError(f"not a Hudi Kafka checkpoint: {checkpoint!r}")
        try:
            out[topic] = {int(p): int(o) for p, o in (pair.split(":") for pair in pairs)}
        except ValueError:
            raise ValueError(f"not a Hudi Kafka checkpoint: {checkpoint!r}") from None
    return out


def format_hudi_checkpoint(offsets: Mapping[str, Mapping[int, int]]) -> str:
    """Inverse of :func:`parse_hudi_checkpoint` (partitions ascending, topics sorted)."""
    if not offsets or not all(offsets.values()):
        raise ValueError("a Hudi checkpoint needs at least one partition per topic")
    return ";".join(
        topic + "," + ",".join(f"{p}:{offsets[topic][p]}" for p in sorted(offsets[topic]))
        for topic in sorted(offsets)
    )


def flatten_offsets(offsets: Offsets) -> dict[TopicPart, int]:
    """``{(topic, partition): offset}`` from nested offsets."""
    return {(t, p): o for t, parts in offsets.items() for p, o in parts.items()}


def nest_offsets(flat: Mapping[TopicPart, int]) -> Offsets:
    """Inverse of :func:`flatten_offsets`, topics and partitions in sorted order."""
    out: Offsets = {}
    for (topic, partition), offset in sorted(flat.items()):
        out.setdefault(topic, {})[partition] = offset
    return out


def split_limit(backlog: Mapping[TopicPart, int], limit: int) -> dict[TopicPart, int]:
    """How many offsets each partition may advance, ``limit`` in total, in proportion to backlog.

    Largest-remainder rounding, so the total is exactly ``min(limit, sum(backlog))``; ties go
    to the larger backlog, so small limits still rotate over all partitions across batches.
    """
    total = sum(backlog.values())
    if total <= limit:
        return dict(backlog)
    share = {tp: lag * limit // total for tp, lag in backlog.items()}
    left = limit - sum(share.values())
    ranked = sorted(backlog, key=lambda tp: (-(backlog[tp] * limit % total), -backlog[tp], tp))
    for tp in ranked[:left]:
        share[tp] += 1
    return share


def report_data_loss(message: str, fail: bool) -> None:
    """Raise :class:`KafkaDataLossError` if ``fail``, else log ``message`` as a warning."""
    if fail:
        raise KafkaDataLossError(message + ". Set failOnDataLoss=false to skip the lost records.")
    log.warning("%s; skipping them (failOnDataLoss=false)", message)


def plan_end_offsets(
    start: Offsets, latest: Offsets, max_offsets: int | None, fail_on_data_loss: bool
) -> Offsets:
    """The end offsets of the next micro-batch from its start and the partitions' latest offsets.

    New partitions (in ``latest`` only) start at 0 - a task reports data loss if retention
    already removed their head. Gone partitions and offsets that moved backwards are data loss;
    without ``failOnDataLoss`` a gone partition is dropped and a partition whose offsets moved
    back resumes from its new latest offset. ``max_offsets`` is split by :func:`split_limit`.
    """
    begin, end_all = flatten_offsets(start), flatten_offsets(latest)
    for tp in sorted(begin.keys() - end_all.keys()):
        report_data_loss(f"topic '{tp[0]}' partition {tp[1]} no longer exists", fail_on_data_loss)
    planned: dict[TopicPart, int] = {}
    backlog: dict[TopicPart, int] = {}
    for tp, latest_offset in end_all.items():
        first = begin.get(tp, 0)
        if latest_offset < first:
            report_data_loss(f"topic '{tp[0]}' partition {tp[1]} offsets went back from {first} "
                             f"to {latest_offset} (topic recreated?)", fail_on_data_loss)
            planned[tp] = latest_offset
        else:
            backlog[tp] = latest_offset - first
    if max_offsets is not None:
        backlog = split_limit(backlog, max_offsets)
    for tp, advance in backlog.items():
        planned[tp] = begin.get(tp, 0) + advance
    return nest_offsets(planned)


def check_offset_range(
    topic: str, partition: int, start: int, end: int, earliest: int, fail_on_data_loss: bool
) -> int:
    """The offset to start reading ``[start, end)`` at, given the partition's earliest offset.

    ``start < earliest`` is data loss: raises :class:`KafkaDataLossError` naming the topic,
    partition and offsets, or (``fail_on_data_loss=False``) logs a warning and skips ahead.
    """
    if start >= earliest:
        return start
    report_data_loss(f"offsets {start} to {min(earliest, end) - 1} of topic '{topic}' partition "
                     f"{partition} are no longer available (earliest offset is {earliest}; "
                     "deleted by retention or the topic was recreated)", fail_on_data_loss)
    return min(earliest, end)

"""Clustering: rewriting small file groups into fewer, sorted ones (docs/engine.md, "Clustering").

Planning (:func:`schedule_clustering`, driver, under the table lock) picks the latest slices
of small file groups, groups them per partition by size and writes
``T.clustering.requested`` (``HoodieRequestedReplaceMetadata`` with a
``HoodieClusteringPlan``, slices with full paths as Java's executor expects).

Execution (:func:`run_clustering`) moves the plan inflight (0 bytes) under the lock and
starts the instant's heartbeat; then, outside the lock, one picklable
:class:`ClusteringTask` per clustering group is run by :func:`execute_clustering_task`
wherever the caller's runner puts it: it reads each slice merged (base + logs, meta fields
kept), sorts the rows (:mod:`engine.services.curves`), splits them into
``numOutputFileGroups`` new file groups named with T. Rows keep ``_hoodie_commit_time`` and
``_hoodie_commit_seqno`` (``preserveHoodieMetadata``); only ``_hoodie_file_name`` changes.

Commit (under the lock): ``T_C.replacecommit`` (``HoodieReplaceCommitMetadata``,
``operationType=CLUSTER``, ``partitionToReplaceFileIds`` = every input group).

Writers are never refused because of a pending clustering (Hudi's default
``SparkRejectUpdateStrategy`` would fail them). Instead clustering carries their work
over: before committing, under the lock, it looks for instants that completed after the
timeline its tasks read from and wrote to (or replaced) one of its input groups; the
clustering groups concerned are executed again from the newer timeline, outside the lock,
so the output holds every completed write. In the last round, under the lock, groups still
touched are dropped instead — left as they are, with the writes, and not replaced — so the
loop ends and the lock is never held for a rewrite (a writer never waits for one). A
writer still inflight when the clustering commits finds its file group replaced at its own
commit and gets a :class:`~engine.errors.WriteConflictError` (:mod:`engine.write.conflict`);
nothing of it was committed and its batch is retried against the new file groups.
Inserts never go to file groups under a pending clustering (:mod:`engine.write.partitioner`).

Crash behaviour: a plan is completed, never abandoned. An inflight attempt whose heartbeat
expired (or is missing, or whose process provably ended) is reverted
(``revert_inflight_service``: a rollback instant deletes its files, the inflight file goes)
and the same plan executed again; an attempt with a live heartbeat is skipped. An attempt
that fails in this process is reverted at once. A stalled attempt that wakes up after
another took the plan over commits nothing and deletes only its own files
(:mod:`engine.services.attempt`).
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from engine.config import IndexType, TableConfig, WriteConfig
from engine.errors import CorruptTableError, InstantStateError, InvalidOptionError
from engine.format.base_file import write_base_file
from engine.format.naming import BaseFileName, new_file_id
from engine.index.consistent_hashing import (
    COMMIT_SUFFIX,
    DELETE,
    HashingMetadata,
    Node,
    apply_children,
    hash_record_keys,
    load_metadata,
    metadata_folder,
    nodes_from_json,
    nodes_json,
    plan_resize,
)
from engine.layout.file_group import FileSlice
from engine.layout.partition import write_partition_metadata
from engine.layout.view import TableView
from engine.metadata import bloom_filters
from engine.metadata.record_index import RECORD_INDEX, changes
from engine.metadata.update import collect_updates, with_update
from engine.read.slice_reader import SliceReader
from engine.schema import (
    FILE_NAME,
    RECORD_KEY,
    arrow_from_avro_json,
    conform,
    data_schema_of,
    with_meta_fields,
)
from engine.services.attempt import AttemptSupersededError, ServiceAttempt, start_attempt
from engine.services.base import ServiceRun, TaskRunner, local_runner
from engine.services.curves import normalize_strategy, sort_table
from engine.storage import Storage
from engine.timeline.active import Timeline, temp_folder
from engine.timeline.commit_metadata import (
    CommitMetadata,
    WriteStat,
    read_avro_ocf,
    write_avro_ocf,
)
from engine.timeline.instant import Action, Instant, new_instant_time
from engine.timeline.rollback_plan import discard_if_superseded
from engine.write.commit import commit_instant
from engine.write.conflict import FileGroupId

if TYPE_CHECKING:
    from engine.write.write_client import WriteClient

CLUSTER = "CLUSTER"
EXECUTION_STRATEGY = ("org.apache.hudi.client.clustering.run.strategy."
                      "SparkSortAndSizeExecutionStrategy")
RESIZE_STRATEGY = ("org.apache.hudi.client.clustering.run.strategy."
                   "SparkConsistentBucketClusteringExecutionStrategy")
PARTITION_KEY = "clustering.group.partition"
CHILD_NODES_KEY = "clustering.group.child.node"
SEQUENCE_NO_KEY = "clustering.group.sequence.no"
SORT_COLUMNS_PARAM = "hoodie.clustering.plan.strategy.sort.columns"
OPTIMISTIC_ROUNDS = 2
"""Carry-over rounds run outside the lock before the last one runs under it."""
_MB = 1024.0 * 1024.0


class ClusteringError(InstantStateError):
    """A clustering attempt lost its instant (another process reverted or completed it)."""


# -- trigger --------------------------------------------------------------------------------


def is_clustering(timeline: Timeline, instant: Instant) -> bool:
    """True for a clustering instant: action ``clustering``, or a completed replacecommit
    whose metadata says ``operationType=CLUSTER``."""
    if instant.action is Action.CLUSTERING:
        return True
    if instant.is_completed and instant.action is Action.REPLACE_COMMIT:
        return timeline.commit_metadata(instant).operation_type == CLUSTER
    return False


def clustering_due(timeline: Timeline, write_config: WriteConfig, *, inline: bool) -> bool:
    """True when at least ``clustering_inline_max_commits`` (``inline``) or
    ``clustering_async_max_commits`` commits completed since the latest clustering
    (pending or completed) — Hudi's trigger."""
    limit = (write_config.clustering_inline_max_commits if inline
             else write_config.clustering_async_max_commits)
    last = ""
    for instant in timeline.instants:
        if instant.action is Action.CLUSTERING or (
                instant.is_completed and is_clustering(timeline, instant)):
            last = max(last, instant.requested_time)
    commits = sum(1 for i in timeline.completed_data_instants
                  if i.requested_time > last and not is_clustering(timeline, i))
    return commits >= limit


# -- planning -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedGroup:
    """One clustering group of a plan: slices of one partition, and how many outputs."""

    partition_path: str
    slices: tuple[FileSlice, ...]
    num_output_groups: int
    extra: Mapping[str, str] = field(default_factory=dict)
    """The group's ``extraMetadata`` (a consistent-hashing resize: its child nodes)."""


def _slice_size(slc: FileSlice, write_config: WriteConfig) -> int:
    """Size Hudi's planner counts: the base file, or the max file size for a log-only one."""
    return slc.base_file.size if slc.base_file is not None else write_config.max_file_size


def plan_groups(storage: Storage, timeline: Timeline,
                write_config: WriteConfig) -> list[PlannedGroup]:
    """The clustering groups a plan would take now (Java ``SparkSizeBasedClusteringPlanStrategy``);
    [] if nothing qualifies."""
    view = TableView(storage, timeline)
    slices = view.latest_file_slices()
    excluded = view.pending_service_groups()
    selected = set(write_config.clustering_partitions_selected)
    regex = (re.compile(write_config.clustering_partition_regex)
             if write_config.clustering_partition_regex else None)
    by_partition: dict[str, list[FileSlice]] = {}
    for slc in slices:
        if (slc.partition_path, slc.file_id) in excluded:
            continue
        if slc.base_file is not None and (slc.base_file.size
                                          >= write_config.clustering_small_file_limit):
            continue
        if selected:  # Java: the selected partitions, else those matching the regex
            if slc.partition_path not in selected:
                continue
        elif regex is not None and not regex.fullmatch(slc.partition_path):
            continue
        by_partition.setdefault(slc.partition_path, []).append(slc)
    groups: list[PlannedGroup] = []
    for partition in sorted(by_partition):
        candidates = sorted(by_partition[partition],
                            key=lambda s: (-_slice_size(s, write_config), s.file_id))
        found: list[tuple[list[FileSlice], int]] = []
        current: list[FileSlice] = []
        size = 0
        for slc in candidates:
            slice_size = _slice_size(slc, write_config)
            # Java: a slice that would take the group past the limit starts the next one
            if current and size + slice_size > write_config.clustering_max_bytes_per_group:
                found.append((current, size))
                current, size = [], 0
            current.append(slc)
            size += slice_size
        # Java drops a trailing one-slice group unless single-group clustering is enabled
        # (the default) or sort columns are set
        if current and (len(current) > 1 or write_config.clustering_single_group
                        or write_config.clustering_sort_columns):
            found.append((current, size))
        for members, total in found:
            outputs = max(1, math.ceil(total / write_config.clustering_target_file_max_bytes))
            groups.append(PlannedGroup(partition, tuple(members), outputs))
    return groups[:write_config.clustering_max_num_groups]


def _metrics(slices: Sequence[FileSlice]) -> dict[str, float]:
    logs = [log for slc in slices for log in slc.log_files]
    log_bytes = float(sum(log.size for log in logs))
    base_bytes = float(sum(s.base_file.size for s in slices if s.base_file is not None))
    read_mb = (base_bytes + log_bytes) / _MB
    write_mb = base_bytes / _MB
    return {"TOTAL_LOG_FILES": float(len(logs)), "TOTAL_LOG_FILES_SIZE": log_bytes,
            "TOTAL_IO_READ_MB": read_mb, "TOTAL_IO_WRITE_MB": write_mb,
            "TOTAL_IO_MB": read_mb + write_mb}


def plan_record(storage: Storage, groups: Sequence[PlannedGroup],
                write_config: WriteConfig) -> dict[str, object]:
    """The ``HoodieRequestedReplaceMetadata`` of a plan (slices with full paths)."""
    input_groups = []
    for group in groups:
        input_groups.append({
            "slices": [{
                "dataFilePath": storage.full(s.base_file.path) if s.base_file else "",
                "deltaFilePaths": [storage.full(log.path) for log in s.log_files],
                "fileId": s.file_id, "partitionPath": s.partition_path,
                "bootstrapFilePath": "", "version": 1} for s in group.slices],
            "metrics": _metrics(group.slices),
            "numOutputFileGroups": group.num_output_groups,
            "extraMetadata": dict(group.extra), "version": 1})
    params = ({SORT_COLUMNS_PARAM: ",".join(write_config.clustering_sort_columns)}
              if write_config.clustering_sort_columns else {})
    resize = any(CHILD_NODES_KEY in g.extra for g in groups)
    return {
        "operationType": CLUSTER,
        "clusteringPlan": {
            "inputGroups": input_groups,
            "strategy": {"strategyClassName": RESIZE_STRATEGY if resize else EXECUTION_STRATEGY,
                         "strategyParams": params,
                         "version": 1},
            "extraMetadata": {}, "version": 1, "preserveHoodieMetadata": True,
            "missingSchedulePartitions": []},
        "extraMetadata": {}, "version": 1}


def schedule_clustering(client: WriteClient) -> str | None:
    """Write a clustering plan if any file group qualifies; returns its instant time.

    BUCKET-index tables are never clustered: a key's file group is its bucket, which a
    rewrite into new file ids would break — except with consistent hashing, whose
    clustering resizes the ring (:func:`schedule_resize`); nor are tables without meta
    fields (``hoodie.populate.meta.fields=false``), whose rows carry no key or commit time
    to preserve. Driver only; takes the table lock."""
    if not client.config.table_version.clustering_action:
        from engine.errors import UnsupportedTableError
        raise UnsupportedTableError(
            f"tidelake clusters table version 8 only; table {client.config.name!r} is "
            f"version {client.config.version}")
    if client.config.consistent_hashing:
        return schedule_resize(client)
    if client.write_config.index_type is IndexType.BUCKET or not client.config.populate_meta_fields:
        return None
    with client.lock:
        timeline = Timeline.load(client.storage, client.config)
        _check_sort_columns(timeline, client.write_config)
        groups = plan_groups(client.storage, timeline, client.write_config)
        if not groups:
            return None
        record = plan_record(client.storage, groups, client.write_config)
        content = write_avro_ocf("HoodieRequestedReplaceMetadata", record)
        instant_time = new_instant_time(timeline.latest_instant_time())
        client.lock.verify()
        timeline.create_requested(Action.CLUSTERING, instant_time, content)
    return instant_time


def schedule_resize(client: WriteClient) -> str | None:
    """Plan a consistent-hashing resize (Java ``SparkConsistentBucketClusteringPlanStrategy``): per
    partition, split large buckets and merge small adjacent ones within
    ``hoodie.bucket.index.{max,min}.num.buckets``; returns the clustering instant, or None when no
    partition needs one.

    As Java: nothing is planned while a deltacommit is pending, and a partition with a file
    group under a pending service is skipped. Unlike Java, a partition is rewritten only when
    a bucket splits or merges in it (Java re-sorts every other bucket of the partition too);
    with sort columns set the other buckets are re-sorted as in Java.
    """
    wc = client.write_config
    max_buckets = wc.bucket_max_num_buckets or wc.num_buckets
    min_buckets = wc.bucket_min_num_buckets or wc.num_buckets
    with client.lock:
        timeline = Timeline.load(client.storage, client.config)
        if timeline.pending((Action.DELTA_COMMIT,)):
            return None
        view = TableView(client.storage, timeline)
        slices = view.latest_file_slices()
        excluded = view.pending_service_groups()
        busy = {partition for partition, _ in excluded}
        by_partition: dict[str, dict[str, FileSlice]] = {}
        for slc in slices:
            by_partition.setdefault(slc.partition_path, {})[slc.file_id] = slc
        groups: list[PlannedGroup] = []
        for partition in sorted(by_partition):
            if partition in busy:
                continue
            ring = view.ring(partition)
            if ring is None:
                continue
            members = by_partition[partition]
            planned = plan_resize(
                ring, {f: s.total_size() for f, s in members.items()},
                max_file_size=wc.max_file_size, split_threshold=wc.bucket_split_threshold,
                merge_threshold=wc.bucket_merge_threshold, min_buckets=min_buckets,
                max_buckets=max_buckets, new_prefix=lambda: str(uuid.uuid4()))
            resized = [g for g in planned if g.outputs == 2 or len(g.file_ids) > 1]
            if not resized:
                continue
            for g in planned if wc.clustering_sort_columns else resized:
                groups.append(PlannedGroup(
                    partition, tuple(members[f] for f in g.file_ids), g.outputs,
                    {PARTITION_KEY: partition, CHILD_NODES_KEY: nodes_json(g.children),
                     SEQUENCE_NO_KEY: str(ring.seq_no)}))
        if not groups:
            return None
        record = plan_record(client.storage, groups, wc)
        content = write_avro_ocf("HoodieRequestedReplaceMetadata", record)
        instant_time = new_instant_time(timeline.latest_instant_time())
        client.lock.verify()
        timeline.create_requested(Action.CLUSTERING, instant_time, content)
    return instant_time


def _check_sort_columns(timeline: Timeline, write_config: WriteConfig) -> None:
    schema_json = timeline.latest_schema()
    if not schema_json or not write_config.clustering_sort_columns:
        return
    names = data_schema_of(arrow_from_avro_json(schema_json)).names
    missing = [c for c in write_config.clustering_sort_columns if c not in names]
    if missing:
        raise InvalidOptionError(SORT_COLUMNS_PARAM, f"{', '.join(missing)} not among the "
                                 f"table's columns ({', '.join(names)})")


def read_plan(timeline: Timeline, instant_time: str) -> dict[str, object]:
    """The decoded ``T.clustering.requested`` of a clustering instant."""
    rel = f"{timeline.folder}/{instant_time}.{Action.CLUSTERING.value}.requested"
    try:
        record = read_avro_ocf(timeline.storage.read(rel))
    except FileNotFoundError:
        raise CorruptTableError(f"clustering {instant_time} has no plan {rel}") from None
    except (ValueError, OSError, EOFError) as exc:
        raise CorruptTableError(f"clustering plan {rel} cannot be read: {exc}") from exc
    if not isinstance(record.get("clusteringPlan"), dict):
        raise CorruptTableError(f"clustering plan {rel} holds no clusteringPlan")
    return record


def _plan_members(record: Mapping[str, object]) -> list[tuple[list[FileGroupId], int]]:
    """(input file groups, numOutputFileGroups) of each clustering group of a plan."""
    plan = record["clusteringPlan"]
    assert isinstance(plan, dict)
    members = []
    for group in plan.get("inputGroups") or []:
        ids = [(str(s.get("partitionPath") or ""), str(s.get("fileId") or ""))
               for s in group.get("slices") or []]
        members.append((ids, int(group.get("numOutputFileGroups") or 1)))
    return members


def _plan_children(record: Mapping[str, object]) -> list[tuple[Node, ...] | None]:
    """Each clustering group's child ring nodes (a consistent-hashing resize), else None."""
    plan = record["clusteringPlan"]
    assert isinstance(plan, dict)
    out: list[tuple[Node, ...] | None] = []
    for group in plan.get("inputGroups") or []:
        extra = group.get("extraMetadata") or {}
        raw = extra.get(CHILD_NODES_KEY)
        out.append(None if raw is None else nodes_from_json(str(raw)))
    return out


def _plan_sequence(record: Mapping[str, object]) -> dict[str, int]:
    """Partition → the ring's seqNo a resize plan was made from."""
    plan = record["clusteringPlan"]
    assert isinstance(plan, dict)
    out = {}
    for group in plan.get("inputGroups") or []:
        extra = group.get("extraMetadata") or {}
        if CHILD_NODES_KEY in extra:
            out[str(extra.get(PARTITION_KEY) or "")] = int(extra.get(SEQUENCE_NO_KEY) or 0)
    return out


# -- execution ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusteringTask:
    """One clustering group's rewrite; picklable, runs on the driver or an executor.

    ``slices`` are the input groups' latest slices under ``visible`` (the timeline the
    attempt reads from); ``schema_json`` the table's Avro data schema.
    """

    storage: Storage
    config: TableConfig
    instant_time: str
    partition_path: str
    slices: tuple[FileSlice, ...]
    visible: Mapping[str, str]
    schema_json: str
    sort_columns: tuple[str, ...]
    strategy: str
    num_output_groups: int
    compression: str = "snappy"
    write_bloom_filter: bool = True
    task_partition: int = 0
    attempt: int = 0
    sync: bool = False
    output_file_ids: tuple[str, ...] = field(default=())
    ring: tuple[Node, ...] = field(default=())
    """A consistent-hashing resize: the partition's ring with this group's children
    applied; rows go to the child their key hashes to (``output_file_ids``)."""
    stage: int = 0
    """The attempt's stage id (:mod:`engine.services.attempt`): no two attempts of one plan
    share a file name."""
    floor: str = ""
    """The timeline's latest time when the attempt started: a rollback of the plan
    requested after it means the attempt was taken over."""
    metadata_partitions: tuple[str, ...] = ()
    """The MDT index partitions the table keeps (the stats' ``metadata`` feeds them)."""


def _output_schema(schema_json: str) -> pa.Schema:
    data = data_schema_of(arrow_from_avro_json(schema_json))
    return with_meta_fields(data)


def execute_clustering_task(task: ClusteringTask) -> list[WriteStat]:
    """Rewrite one clustering group into new file groups; returns one stat per new file.

    Executor side: touches only new files named with the clustering instant, never the
    timeline. A retried task writes new file ids; the driver deletes files no stat names.
    """
    storage = task.storage
    schema = _output_schema(task.schema_json)
    reader = SliceReader(storage, Timeline(storage, task.config, ()), task.visible,
                         arrow_from_avro_json(task.schema_json))
    parts = [conform(reader.read_slice(slc), schema) for slc in task.slices]
    rows = pa.concat_tables(parts) if parts else schema.empty_table()
    rows = sort_table(rows, task.sort_columns, task.strategy)
    if rows.num_rows == 0:
        return []
    write_partition_metadata(storage, task.partition_path, task.instant_time)
    if task.ring:
        chunks = _route_to_children(rows, task)
    else:
        outputs = max(1, min(task.num_output_groups, rows.num_rows))
        file_ids = list(task.output_file_ids) or [new_file_id() for _ in range(outputs)]
        bounds = [round(i * rows.num_rows / outputs) for i in range(outputs + 1)]
        chunks = [(file_ids[i], rows.slice(bounds[i], bounds[i + 1] - bounds[i]))
                  for i in range(outputs)]
    token = f"{task.task_partition}-{task.stage}-{task.attempt}"
    stats = []
    for file_id, chunk in chunks:
        name = BaseFileName(file_id, token, task.instant_time).name
        rel = f"{task.partition_path}/{name}" if task.partition_path else name
        chunk = chunk.set_column(chunk.schema.get_field_index(FILE_NAME), FILE_NAME,
                                 pa.array([name] * chunk.num_rows, pa.string()))
        result = write_base_file(rel, chunk, bloom=task.write_bloom_filter,
                                 compression=task.compression, fsync=task.sync,
                                 storage=storage)
        stat = WriteStat(
            file_id=file_id, path=rel, partition_path=task.partition_path,
            prev_commit="null", num_writes=chunk.num_rows, num_inserts=chunk.num_rows,
            total_write_bytes=result.file_size, file_size_in_bytes=result.file_size,
            metadata=bloom_filters.file_update(task.metadata_partitions, task.partition_path,
                                               name, task.instant_time, result))
        if RECORD_INDEX in task.metadata_partitions:  # every key moves to the new group
            stat = with_update(stat, changes(
                task.partition_path, file_id, task.instant_time,
                chunk.column(RECORD_KEY).combine_chunks().cast(pa.string()).to_pylist(), ()))
        stats.append(stat)
    if task.floor:  # taken over while running (a stalled attempt's late task)?
        discard_if_superseded(storage, Timeline.folder_for(task.config), task.instant_time,
                              [s.path for s in stats], task.floor)
    return stats


def _route_to_children(rows: pa.Table, task: ClusteringTask) -> list[tuple[str, pa.Table]]:
    """A resize group's rows by the child node their key hashes to (sorted order kept)."""
    ring = HashingMetadata(task.partition_path, task.instant_time, 1, 0, task.ring)
    targets = [ring.nodes[i].file_id for i in ring.node_indices(
        hash_record_keys(rows.column(RECORD_KEY)))]
    outputs = set(task.output_file_ids)
    strays = sorted(set(targets) - outputs)
    if strays:
        raise CorruptTableError(f"resize {task.instant_time}: rows of partition "
                                f"{task.partition_path!r} hash outside the group's children "
                                f"(to {strays[0]}); the plan does not match the ring")
    column = pa.array(targets, pa.string())
    return [(file_id, rows.filter(pc.equal(column, file_id)))
            for file_id in task.output_file_ids if file_id in set(targets)]


class _Attempt:
    """The driver's state while executing one plan."""

    def __init__(self, owner: ServiceAttempt, record: Mapping[str, object],
                 runner: TaskRunner) -> None:
        self.owner = owner
        self.client = owner.client
        self.instant = owner.instant
        self.members = _plan_members(record)
        self.children = _plan_children(record)
        self.sequence = _plan_sequence(record)
        self.runner = runner
        self.stats: dict[int, list[WriteStat]] = {}
        self.seen: frozenset[str] = frozenset()
        self.rounds = 0
        self.carried_over = 0
        """Clustering groups executed again to carry concurrent writes over."""
        self.dropped: set[int] = set()
        """Clustering groups left out of the commit: written to until the last round."""

    @property
    def kept(self) -> list[int]:
        return [i for i in range(len(self.members)) if i not in self.dropped]

    @property
    def input_groups(self) -> set[FileGroupId]:
        return {g for i in self.kept for g in self.members[i][0]}

    def drop(self, which: Sequence[int]) -> None:
        """Leave these clustering groups out: their outputs are deleted, their input groups
        stay as they are (with the writes that touched them) and are not replaced."""
        for index in which:
            for stat in self.stats.pop(index, []):
                self.client.storage.delete(stat.path)
            self.dropped.add(index)

    def tasks(self, timeline: Timeline, which: Sequence[int]) -> list[ClusteringTask]:
        """Tasks of the given clustering groups, reading from ``timeline``."""
        client = self.client
        view = TableView(client.storage, timeline)
        visible = view.visible
        live = view.latest_by_group()
        schema_json = timeline.latest_schema() or ""
        if not schema_json:
            raise CorruptTableError("the table has no schema (no commit records one); "
                                    "nothing to cluster")
        tasks = []
        rings: dict[str, HashingMetadata] = {}
        for index in which:
            ids, outputs = self.members[index]
            slices = tuple(live[g] for g in ids if g in live)
            partition = ids[0][0] if ids else ""
            children = self.children[index]
            ring: tuple[Node, ...] = ()
            output_ids: tuple[str, ...] = ()
            if children is not None:
                if partition not in rings:
                    rings[partition] = self._committed_ring(timeline, partition)
                ring = apply_children(rings[partition], children, "0").nodes
                output_ids = tuple(c.file_id for c in children if c.tag != DELETE)
            tasks.append(ClusteringTask(
                storage=client.storage, config=client.config,
                instant_time=self.instant.requested_time, partition_path=partition,
                slices=slices, visible=dict(visible), schema_json=schema_json,
                sort_columns=tuple(client.write_config.clustering_sort_columns),
                strategy=normalize_strategy(client.write_config.layout_optimize_strategy),
                num_output_groups=outputs, compression=client.write_config.compression,
                write_bloom_filter=client.write_config.write_bloom_filter,
                task_partition=index, attempt=self.rounds, ring=ring,
                output_file_ids=output_ids, stage=self.owner.stage, floor=self.owner.floor,
                metadata_partitions=client.metadata_index_partitions()))
        return tasks

    def _committed_ring(self, timeline: Timeline, partition: str) -> HashingMetadata:
        """The partition's committed ring, which must still be the one the plan was made
        from (its seqNo): a resize applies its children to exactly that ring."""
        ring = load_metadata(self.client.storage, timeline, partition)
        planned = self.sequence.get(partition)
        if ring is None or ring.seq_no != planned:
            found = "none" if ring is None else f"seqNo {ring.seq_no}"
            raise ClusteringError(
                f"resize {self.instant.requested_time}: the hashing metadata of partition "
                f"{partition!r} is {found}, the plan was made from seqNo {planned}")
        return ring

    def write_rings(self, timeline: Timeline) -> list[str]:
        """Write each resized partition's new ring as ``T.hashing_meta`` (before the
        replacecommit completes; its ``.commit`` marker after). Returns their folders."""
        by_partition: dict[str, list[Node]] = {}
        for index in self.kept:
            (ids, _), children = self.members[index], self.children[index]
            if children is not None and ids:
                by_partition.setdefault(ids[0][0], []).extend(children)
        folders = []
        for partition, nodes in sorted(by_partition.items()):
            ring = apply_children(self._committed_ring(timeline, partition), nodes,
                                  self.instant.requested_time)
            folder = metadata_folder(partition)
            self.client.storage.write_replace(f"{folder}/{ring.file_name}", ring.to_json())
            folders.append(folder)
        return folders

    def execute(self, timeline: Timeline, which: Sequence[int]) -> None:
        """(Re)write the outputs of the given groups from ``timeline``."""
        for index in which:
            for stat in self.stats.pop(index, []):
                self.client.storage.delete(stat.path)
        if self.rounds:
            self.carried_over += len(which)
        tasks = self.tasks(timeline, which)
        results = self.runner(execute_clustering_task, tasks)
        for index, stats in zip(which, results, strict=True):
            self.stats[index] = list(stats)
        self.seen = timeline.completed_times
        self.rounds += 1

    def touched_since(self, now: Timeline) -> list[int]:
        """Clustering groups whose input groups an instant completed since ``seen`` wrote
        to or replaced (their work must be carried over)."""
        touched: set[FileGroupId] = set()
        inputs = self.input_groups
        for other in now.completed_data_instants:
            if other.requested_time in self.seen:
                continue
            meta = now.commit_metadata(other)
            touched |= {(s.partition_path, s.file_id) for s in meta.write_stats} & inputs
            touched |= {(p, f) for p, ids in meta.partition_to_replace_file_ids.items()
                        for f in ids} & inputs
        return [i for i in self.kept if touched & set(self.members[i][0])]

    def metadata(self, now: Timeline) -> bytes:
        replaced: dict[str, list[str]] = {}
        for partition, file_id in sorted(self.input_groups):
            replaced.setdefault(partition, []).append(file_id)
        stats = tuple(s for i in sorted(self.stats) for s in self.stats[i])
        extra = dict(now.rolling_metadata(self.client.write_config.rolling_metadata_keys))
        extra["schema"] = now.latest_schema() or ""
        meta = CommitMetadata(write_stats=stats, operation_type=CLUSTER, extra_metadata=extra,
                              partition_to_replace_file_ids={
                                  p: tuple(sorted(ids)) for p, ids in replaced.items()})
        return meta.to_avro_bytes()

    def remove_strays(self) -> None:
        """This attempt's files that no stat names (failed task tries)."""
        self.owner.remove_strays(s.path for stats in self.stats.values() for s in stats)


def _commit(attempt: _Attempt) -> Instant:
    """Carry concurrent writes over, then publish ``T_C.replacecommit`` under the lock.

    Optimistic rounds re-execute, outside the lock, the clustering groups whose inputs an
    instant wrote to since the last round; in the last round, under the lock, groups still
    touched are dropped instead (left as they are, not replaced), so the lock is held only
    for bookkeeping and a writer never waits for a rewrite."""
    client = attempt.client
    for round_ in range(OPTIMISTIC_ROUNDS + 1):
        final = round_ == OPTIMISTIC_ROUNDS
        attempt.remove_strays()
        client.storage.sync()
        with client.lock:
            now = Timeline.load(client.storage, client.config)
            attempt.owner.check_owner(now)
            touched = attempt.touched_since(now)
            if touched and final:
                attempt.drop(touched)
                touched = []
            if not touched:
                rings = attempt.write_rings(now)
                content = attempt.metadata(now)
                inflight = attempt.instant
                done = commit_instant(now, inflight, content, collect_updates(
                    s for stats in attempt.stats.values() for s in stats))
                for folder in rings:  # lost on a crash: loading commits it (completed T)
                    client.storage.write_replace(
                        f"{folder}/{inflight.requested_time}{COMMIT_SUFFIX}", b"")
                return done
        attempt.execute(now, touched)
    raise AssertionError("unreachable")


def execute_clustering(client: WriteClient, instant_time: str, *,
                       runner: TaskRunner = local_runner,
                       explicit: bool = False) -> tuple[Instant, dict[str, int]] | None:
    """Execute one clustering plan to completion; returns the completed instant and counts
    (input file groups replaced, rows written, groups executed again to carry concurrent
    writes over, groups dropped because writes kept touching them), or None if it is not
    pending or a live attempt owns it (:mod:`engine.services.attempt`)."""
    owner = start_attempt(client, instant_time, Action.CLUSTERING, explicit=explicit)
    if owner is None:
        return None
    attempt = _Attempt(owner, read_plan(owner.timeline, instant_time), runner)
    try:
        attempt.execute(owner.timeline, list(range(len(attempt.members))))
        done = _commit(attempt)
    except BaseException as exc:
        owned = owner.abandon()
        if isinstance(exc, AttemptSupersededError):
            raise ClusteringError(str(exc)) from exc
        if isinstance(exc, FileNotFoundError):  # an input the cleaner removed, or by hand
            raise ClusteringError(owner.failure(exc, owned)) from exc
        raise
    owner.heartbeat.stop()
    client.storage.delete_tree(temp_folder(instant_time))
    rows = sum(s.num_writes for stats in attempt.stats.values() for s in stats)
    return done, {"file_groups": len(attempt.input_groups), "rows": rows,
                  "carried_over_groups": attempt.carried_over,
                  "dropped_groups": len(attempt.dropped)}


def run_clustering(client: WriteClient, instant: str | None = None, *,
                   runner: TaskRunner = local_runner) -> ServiceRun:
    """Execute the given pending clustering plan, or every pending one (oldest first)."""
    if instant is not None:
        targets = [instant]
    else:
        timeline = Timeline.load(client.storage, client.config)
        targets = [i.requested_time for i in timeline.pending((Action.CLUSTERING,))]
    completed: list[str] = []
    details = {"file_groups": 0, "rows": 0, "carried_over_groups": 0, "dropped_groups": 0}
    for target in targets:
        result = execute_clustering(client, target, runner=runner,
                                    explicit=instant is not None)
        if result is None:
            continue
        done, counts = result
        completed.append(done.requested_time)
        for key, value in counts.items():
            details[key] += value
    return ServiceRun("clustering", None, tuple(completed), details)


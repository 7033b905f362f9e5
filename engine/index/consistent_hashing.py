"""Consistent-hashing bucket index (RFC-42): hash, ring and hashing metadata files.

With ``hoodie.index.type=BUCKET`` and ``hoodie.index.bucket.engine=CONSISTENT_HASHING`` each
partition's key space ``[0, 2^31)`` is cut into ranges, the *nodes* of a ring; every node is
one file group, and a clustering resizes them (splits big ones, merges small neighbours)
without rehashing the rest (docs/engine.md, "Consistent-hashing buckets and their resizes").

* **Hash** (``ConsistentBucketIdentifier.getBucket``): ``xxh32(UTF-8(join("", hash keys)),
  seed 0) & 0x7fffffff``. The hash keys are the bucket index's
  (:func:`engine.index.bucket.hash_keys`), joined without a separator as Java's
  ``String.join`` does — a null value joins as ``"null"``.
* **Ring**: nodes sorted by value; a hash goes to the first node whose value is at least the
  hash, wrapping to the first node.
* **Initial nodes** for ``n`` buckets: values ``min(step * i, 2^31 - 1)`` for ``i = 1..n`` with
  ``step = ceil((2^31 - 1) / n)``; file id prefix ``UUID.nameUUIDFromBytes(BE int64 start ‖
  BE int64 end ‖ UTF-8 partition)``; file id ``<prefix>-0``.
* **Metadata files**: ``.hoodie/.bucket_index/consistent_hashing_metadata/<partition>/``
  ``<instant>.hashing_meta`` (Jackson's pretty-printed JSON, field order as declared) and an
  empty ``<instant>.commit`` marker once that metadata is committed. :func:`load_metadata`
  follows ``ConsistentBucketIndexUtils.loadMetadata``.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import CorruptTableError
from engine.format.jackson import pretty_json
from engine.index.bucket import hash_keys
from engine.storage import Storage
from engine.timeline.active import Timeline

__all__ = [
    "HASH_VALUE_MASK",
    "INIT_INSTANT",
    "METADATA_FOLDER",
    "HashingMetadata",
    "Node",
    "committed_ring",
    "ensure_initial_metadata",
    "hash_record_keys",
    "load_metadata",
    "locate_nodes",
    "xxh32",
    "xxh32_array",
]

HASH_VALUE_MASK = 0x7FFFFFFF
INIT_INSTANT = "00000000000000"
"""Instant of a partition's first hashing metadata (``HoodieTimeline.INIT_INSTANT_TS``)."""
METADATA_FOLDER = ".hoodie/.bucket_index/consistent_hashing_metadata"
METADATA_SUFFIX = ".hashing_meta"
COMMIT_SUFFIX = ".commit"
NORMAL, REPLACE, DELETE = "NORMAL", "REPLACE", "DELETE"

_P1, _P2, _P3, _P4, _P5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
_M32 = 0xFFFFFFFF


# -- xxh32 ---------------------------------------------------------------------------------


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def xxh32(data: bytes, seed: int = 0) -> int:
    """The 32-bit xxHash of ``data`` (unsigned), as lz4-java's ``XXHash32``."""
    n = len(data)
    pos = 0
    if n >= 16:
        v = [(seed + _P1 + _P2) & _M32, (seed + _P2) & _M32, seed & _M32,
             (seed - _P1) & _M32]
        while pos + 16 <= n:
            for i in range(4):
                lane = int.from_bytes(data[pos + 4 * i:pos + 4 * i + 4], "little")
                v[i] = (_rotl((v[i] + lane * _P2) & _M32, 13) * _P1) & _M32
            pos += 16
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M32
    else:
        h = (seed + _P5) & _M32
    h = (h + n) & _M32
    while pos + 4 <= n:
        word = int.from_bytes(data[pos:pos + 4], "little")
        h = (_rotl((h + word * _P3) & _M32, 17) * _P4) & _M32
        pos += 4
    while pos < n:
        h = (_rotl((h + data[pos] * _P5) & _M32, 11) * _P1) & _M32
        pos += 1
    h ^= h >> 15
    h = (h * _P2) & _M32
    h ^= h >> 13
    h = (h * _P3) & _M32
    return h ^ (h >> 16)


_U = np.uint32


def _vrotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << _U(r)) | (x >> _U(32 - r))


def xxh32_array(values: pa.Array | pa.ChunkedArray, seed: int = 0) -> np.ndarray:
    """:func:`xxh32` of every value's UTF-8 bytes (nulls hash as ``b""``), vectorized."""
    arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    arr = pc.fill_null(arr.cast(pa.large_binary()), b"")
    n = len(arr)
    if n == 0:
        return np.zeros(0, np.uint32)
    offsets = np.frombuffer(arr.buffers()[1], np.int64, n + 1, arr.offset * 8)
    data = np.frombuffer(arr.buffers()[2], np.uint8) if arr.buffers()[2] else \
        np.zeros(0, np.uint8)
    lengths = (offsets[1:] - offsets[:-1]).astype(np.int64)
    width = int(-(-max(int(lengths.max()), 1) // 16) * 16) + 16
    matrix = np.zeros((n, width), np.uint8)
    total = int(lengths.sum())
    if total:
        rows = np.repeat(np.arange(n), lengths)
        cols = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        matrix[rows, cols] = data[offsets[0] + np.arange(total)]
    words = matrix.view("<u4")  # (n, width / 4), little-endian 32-bit words
    seed_u = _U(seed & _M32)
    with np.errstate(over="ignore"):
        stripes = lengths // 16
        v = [np.full(n, (seed + _P1 + _P2) & _M32, _U), np.full(n, (seed + _P2) & _M32, _U),
             np.full(n, seed_u, _U), np.full(n, (seed - _P1) & _M32, _U)]
        for s in range(int(stripes.max())):
            active = stripes > s
            for i in range(4):
                step = _vrotl(v[i] + words[:, 4 * s + i] * _U(_P2), 13) * _U(_P1)
                v[i] = np.where(active, step, v[i])
        long_h = _vrotl(v[0], 1) + _vrotl(v[1], 7) + _vrotl(v[2], 12) + _vrotl(v[3], 18)
        h = np.where(lengths >= 16, long_h, _U((seed + _P5) & _M32)).astype(_U)
        h = h + lengths.astype(_U)
        pos = stripes * 16
        rows_idx = np.arange(n)
        for _ in range(3):  # at most three 4-byte words after the stripes
            active = pos + 4 <= lengths
            if not active.any():
                break
            # stripes and words keep pos a multiple of 4: pos // 4 is its word
            word = words[rows_idx, np.minimum(pos // 4, words.shape[1] - 1)]
            h = np.where(active, _vrotl(h + word * _U(_P3), 17) * _U(_P4), h)
            pos = np.where(active, pos + 4, pos)
        for _ in range(3):  # at most three bytes after the words
            active = pos < lengths
            if not active.any():
                break
            byte = matrix[rows_idx, np.minimum(pos, width - 1)].astype(_U)
            h = np.where(active, _vrotl(h + byte * _U(_P5), 11) * _U(_P1), h)
            pos = np.where(active, pos + 1, pos)
        h ^= h >> _U(15)
        h *= _U(_P2)
        h ^= h >> _U(13)
        h *= _U(_P3)
        h ^= h >> _U(16)
    return h.astype(np.uint32)


def hash_record_keys(keys: pa.Array | pa.ChunkedArray,
                     hash_fields: Sequence[str] | str | None = None) -> np.ndarray:
    """The consistent-hashing value (``[0, 2^31)``, int64) of each record key."""
    arr = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    arr = arr.cast(pa.string())
    simple = pc.invert(pc.and_(pc.match_substring(arr, ","), pc.match_substring(arr, ":")))
    simple = pc.fill_null(simple, True)
    hashed = xxh32_array(arr)
    complex_rows = np.flatnonzero(~simple.to_numpy(zero_copy_only=False))
    if len(complex_rows):  # field:value keys: the hash fields' values, joined
        joined = ["".join("null" if v is None else v for v in hash_keys(arr[int(i)].as_py(),
                                                                        hash_fields))
                  for i in complex_rows]
        hashed[complex_rows] = xxh32_array(pa.array(joined, pa.string()))
    return (hashed & _U(HASH_VALUE_MASK)).astype(np.int64)


# -- nodes and metadata --------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    """One range of the ring: hashes in (previous value, value] belong to file group
    ``<file_id_prefix>-0``."""

    value: int
    file_id_prefix: str
    tag: str = NORMAL

    @property
    def file_id(self) -> str:
        return f"{self.file_id_prefix}-0"

    def fields(self) -> dict[str, object]:
        """The node as Java's ``ConsistentHashingNode`` serialises it, fields in order."""
        return {"value": self.value, "fileIdPrefix": self.file_id_prefix, "tag": self.tag}


def _name_uuid(data: bytes) -> str:
    """Java ``UUID.nameUUIDFromBytes``: an MD5 name-based (version 3) UUID."""
    return str(uuid.UUID(bytes=hashlib.md5(data).digest(), version=3))


def initial_nodes(partition_path: str, num_buckets: int) -> list[Node]:
    """The ring of a partition's first metadata (``constructDefaultHashingNodes``)."""
    if num_buckets < 1:
        raise ValueError(f"num_buckets must be at least 1, got {num_buckets}")
    step = (HASH_VALUE_MASK + num_buckets - 1) // num_buckets
    nodes, start = [], 0
    for i in range(1, num_buckets + 1):
        end = min(step * i, HASH_VALUE_MASK)
        seed = start.to_bytes(8, "big") + end.to_bytes(8, "big") + partition_path.encode()
        nodes.append(Node(end, _name_uuid(seed)))
        start = end
    return nodes


@dataclass(frozen=True)
class HashingMetadata:
    """``HoodieConsistentHashingMetadata``: one partition's ring as of an instant."""

    partition_path: str
    instant: str
    num_buckets: int
    """The initially configured count (Java never updates it after resizes)."""
    seq_no: int
    nodes: tuple[Node, ...]
    version: int = 0
    _values: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.nodes, key=lambda n: n.value))
        if len({n.value for n in ordered}) != len(ordered) or not ordered:
            raise CorruptTableError(f"hashing metadata of partition {self.partition_path!r} "
                                    f"at {self.instant}: node values must be distinct, and "
                                    "there must be at least one node")
        object.__setattr__(self, "nodes", ordered)
        object.__setattr__(self, "_values", np.array([n.value for n in ordered], np.int64))

    @classmethod
    def initial(cls, partition_path: str, num_buckets: int) -> HashingMetadata:
        return cls(partition_path, INIT_INSTANT, num_buckets, 0,
                   tuple(initial_nodes(partition_path, num_buckets)))

    @property
    def file_name(self) -> str:
        return f"{self.instant}{METADATA_SUFFIX}"

    def node_indices(self, hashes: np.ndarray) -> np.ndarray:
        """Index into :attr:`nodes` of each hash's node (first value ≥ hash, wrapping)."""
        at = np.searchsorted(self._values, hashes, side="left")
        return np.where(at >= len(self._values), 0, at)

    def file_ids(self, keys: pa.Array | pa.ChunkedArray,
                 hash_fields: Sequence[str] | str | None = None) -> list[str]:
        """The file group of each record key."""
        ids = [n.file_id for n in self.nodes]
        return [ids[i] for i in self.node_indices(hash_record_keys(keys, hash_fields))]

    def to_json(self) -> bytes:
        """The file's bytes as Jackson's default pretty printer writes them
        (:func:`engine.format.jackson.pretty_json`), fields in ``HoodieConsistentHashingMetadata``'s
        order."""
        return pretty_json({
            "version": self.version, "partitionPath": self.partition_path,
            "instant": self.instant, "numBuckets": self.num_buckets, "seqNo": self.seq_no,
            "nodes": [n.fields() for n in self.nodes]}).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes, where: str = "hashing metadata") -> HashingMetadata:
        """Parse a ``.hashing_meta`` file (0.11/0.12's ``fileIdPfx`` and missing tags too)."""
        try:
            raw = json.loads(data.decode("utf-8"))
            nodes = tuple(Node(int(n["value"]), str(n.get("fileIdPrefix") or n["fileIdPfx"]),
                               str(n.get("tag") or NORMAL)) for n in raw["nodes"])
            return cls(str(raw.get("partitionPath") or ""), str(raw["instant"]),
                       int(raw["numBuckets"]), int(raw.get("seqNo") or 0), nodes,
                       int(raw.get("version") or 0))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptTableError(f"{where}: {exc}") from exc


# -- files ---------------------------------------------------------------------------------


_FILE = re.compile(r"^(\d+)\.(hashing_meta|commit)$")


def metadata_folder(partition_path: str) -> str:
    return f"{METADATA_FOLDER}/{partition_path}" if partition_path else METADATA_FOLDER


def load_metadata(storage: Storage, timeline: Timeline,
                  partition_path: str) -> HashingMetadata | None:
    """The partition's committed ring (``ConsistentBucketIndexUtils.loadMetadata``).

    The newest metadata file with a ``.commit`` marker counts — as of ``timeline``: one whose
    instant is pending there, or newer than the snapshot, is ignored; a newer one without a marker
    is committed now (its marker written) when its instant completed on the timeline — a
    resize whose marker was lost after its replacecommit — or it is the initial file;
    otherwise it belongs to a pending resize and is ignored. None: no metadata yet.

    A resize whose marker was lost and whose replacecommit has been archived since is found
    in the timeline history and committed too (Java "recommits" such a file when its nodes
    name latest base files; the history is the direct evidence).
    """
    folder = metadata_folder(partition_path)
    metas: dict[str, str] = {}
    markers: set[str] = set()
    for status in storage.list_dir(folder):
        m = _FILE.match(status.name)
        if m is None:
            continue
        if m.group(2) == "commit":
            markers.add(m.group(1))
        else:
            metas[m.group(1)] = status.name
    if not metas:
        return None
    # As of ``timeline``: a resize still pending there, or newer than anything on it, does not
    # count even when its marker is there already (it committed after the snapshot was
    # taken): the file groups a writer sees in that snapshot are the parents, not its
    # children (a CREATE into a child would shadow the resize's base file).
    pending = {i.requested_time for i in timeline.instants if not i.is_completed}
    latest = timeline.latest_instant_time()
    metas = {t: name for t, name in metas.items() if t == INIT_INSTANT or (
        t not in pending and (t <= latest or timeline.find(t) is not None))}
    committed = [t for t in metas if t in markers]
    chosen = max(committed) if committed else None
    completed = {i.requested_time for i in timeline.completed_data_instants}
    for instant in sorted(t for t in metas if chosen is None or t > chosen):
        if instant == INIT_INSTANT or instant in completed or _archived_resize(timeline, instant):
            storage.write_replace(f"{folder}/{instant}{COMMIT_SUFFIX}", b"")
            chosen = instant
    if chosen is None:
        return None
    rel = f"{folder}/{metas[chosen]}"
    return HashingMetadata.from_json(storage.read(rel), rel)


def _archived_resize(timeline: Timeline, instant: str) -> bool:
    """True if ``instant`` is a replacecommit the timeline history holds (archived, so
    completed). Only asked for metadata files the active timeline does not know."""
    if instant in timeline.active_times:
        return False
    row = timeline.archived().get(instant)
    return row is not None and row.action == "replacecommit"


def load_or_create_metadata(storage: Storage, timeline: Timeline, partition_path: str,
                            num_buckets: int) -> HashingMetadata:
    """The partition's committed ring; for a partition without one, its initial ring,
    written first (``ConsistentBucketIndexUtils.loadOrCreateMetadata``): every writer
    writes the same bytes, so no lock is needed, and the marker follows once it is there."""
    found = load_metadata(storage, timeline, partition_path)
    return found if found is not None else _write_initial(storage, partition_path, num_buckets)


def _write_initial(storage: Storage, partition_path: str, num_buckets: int) -> HashingMetadata:
    initial = HashingMetadata.initial(partition_path, num_buckets)
    folder = metadata_folder(partition_path)
    storage.makedirs(folder)
    storage.write_replace(f"{folder}/{initial.file_name}", initial.to_json())
    storage.write_replace(f"{folder}/{INIT_INSTANT}{COMMIT_SUFFIX}", b"")
    return initial


def locate_nodes(records_keys: pa.Array | pa.ChunkedArray,
                 partitions: pa.Array | pa.ChunkedArray,
                 ring_of: Callable[[str], HashingMetadata]
                 ) -> list[tuple[HashingMetadata, np.ndarray, np.ndarray]]:
    """Where each row's key falls, partition by partition: ``(the partition's ring, row
    indices, the index in ``ring.nodes`` of each of those rows' node)``. The one rule that
    places a key (the engine's writes and the streaming job's prepare both use it)."""
    hashes = hash_record_keys(records_keys)
    parts = partitions.combine_chunks() if isinstance(partitions, pa.ChunkedArray) \
        else partitions
    encoded = parts.dictionary_encode()
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    out = []
    for code, partition in enumerate(encoded.dictionary.to_pylist()):
        rows = np.flatnonzero(codes == code)
        if len(rows):
            ring = ring_of(partition)
            out.append((ring, rows, ring.node_indices(hashes[rows])))
    return out


def route(records_keys: pa.Array | pa.ChunkedArray, partitions: pa.Array | pa.ChunkedArray,
          ring_of: Callable[[str], HashingMetadata]) -> list[tuple[str, str, np.ndarray]]:
    """Group rows by the file group their key's hash falls in, partition by partition:
    ``(partition, file id, row indices)`` in partition then ring order."""
    out = []
    for ring, rows, nodes in locate_nodes(records_keys, partitions, ring_of):
        for node in np.unique(nodes).tolist():
            out.append((ring.partition_path, ring.nodes[node].file_id, rows[nodes == node]))
    return out


_SEEN: dict[tuple[str, str], tuple[str, HashingMetadata]] = {}
"""(base path, partition) → (metadata file name, its ring): :func:`committed_ring`'s cache."""


def committed_ring(storage: Storage, partition_path: str, num_buckets: int) -> HashingMetadata:
    """The partition's ring as committed on storage right now, read without a timeline and
    never written: the newest metadata file with a ``.commit`` marker, else the initial file,
    else the initial ring. For tasks that only need to agree with the ring a writer's
    snapshot holds (the streaming job's prepare tasks: a write task checks that they did,
    see ``ingest.spark_write.place_rows``); one listing per call, a file read when it
    changed."""
    names = {s.name for s in storage.list_dir(metadata_folder(partition_path))}
    marked = [m.group(1) for m in map(_FILE.match, names)
              if m is not None and m.group(2) == "hashing_meta"
              and f"{m.group(1)}{COMMIT_SUFFIX}" in names]
    if not marked and f"{INIT_INSTANT}{METADATA_SUFFIX}" not in names:
        return HashingMetadata.initial(partition_path, num_buckets)
    name = f"{max(marked) if marked else INIT_INSTANT}{METADATA_SUFFIX}"
    key = (storage.base_path, partition_path)
    seen = _SEEN.get(key)
    if seen is None or seen[0] != name:
        rel = f"{metadata_folder(partition_path)}/{name}"
        seen = (name, HashingMetadata.from_json(storage.read(rel), rel))
        _SEEN[key] = seen
    return seen[1]


def ensure_initial_metadata(storage: Storage, partition_path: str, num_buckets: int) -> None:
    """Write a partition's initial ring and its marker unless the partition has metadata
    (a write task's first write into a new partition; the bytes are the same from anyone)."""
    if not any(_FILE.match(s.name) for s in storage.list_dir(metadata_folder(partition_path))):
        _write_initial(storage, partition_path, num_buckets)


# -- resizing (planned as a clustering; Java ``ConsistentBucketIndexUtils``) ------------------


@dataclass(frozen=True)
class ResizeGroup:
    """One group of a resize plan: the file groups it reads and the ring nodes it writes
    (``clustering.group.child.node``); ``outputs`` file groups (2: a split, 1: a merge or a
    re-sort)."""

    file_ids: tuple[str, ...]
    children: tuple[Node, ...]
    outputs: int


def split_point(former: int, value: int) -> int | None:
    """The boundary that halves the range (former, value], wrapping for the ring's first
    node (and the whole ring for a ring of one node, its own former); None when the range is
    too small to split (``ConsistentBucketIdentifier.splitBucket``)."""
    wrap = 0 if former < value else (HASH_VALUE_MASK + 1)
    mid = ((former + value + wrap) >> 1) & HASH_VALUE_MASK
    return None if mid in (former, value) else mid


def plan_resize(ring: HashingMetadata, sizes: Mapping[str, int], *, max_file_size: int,
                split_threshold: float, merge_threshold: float, min_buckets: int,
                max_buckets: int, new_prefix: Callable[[], str]) -> list[ResizeGroup]:
    """Java's ``BaseConsistentHashingBucketClusteringPlanStrategy`` for one partition:
    split the file groups above ``max_file_size x split_threshold`` bytes while the ring
    stays within ``max_buckets``, merge runs of small ring-adjacent groups while it stays
    above ``min_buckets``, and re-sort every other group (a new file id at the same node).

    ``sizes``: file id → bytes of its latest slice (base and logs), for the groups of the
    partition that are not under a pending clustering. ``new_prefix`` makes new file id
    prefixes (random UUIDs in Java).
    """
    nodes = list(ring.nodes)
    position = {n.file_id: i for i, n in enumerate(nodes)}
    groups: list[ResizeGroup] = []
    split_size = int(max_file_size * split_threshold)
    slots = max_buckets - len(nodes)
    untouched: list[str] = []
    for file_id in sorted(sizes, key=lambda f: position.get(f, -1)):
        if file_id not in position:
            continue  # not a node of the committed ring (written by nobody we know)
        i = position[file_id]
        mid = split_point(nodes[i - 1].value, nodes[i].value)  # nodes[-1]: wraps
        if sizes[file_id] <= split_size or slots == 0 or mid is None:
            untouched.append(file_id)
            continue
        slots -= 1
        groups.append(ResizeGroup((file_id,), (Node(mid, new_prefix(), REPLACE),
                                               Node(nodes[i].value, new_prefix(), REPLACE)), 2))
    splits = (max_buckets - len(nodes)) - slots
    merge_slots = len(nodes) - min_buckets + splits
    merged, groups_merged = _plan_merges(nodes, position, untouched, sizes,
                                         int(max_file_size * merge_threshold), merge_slots,
                                         new_prefix)
    groups.extend(groups_merged)
    for file_id in untouched:
        if file_id not in merged:
            node = nodes[position[file_id]]
            groups.append(ResizeGroup((file_id,), (Node(node.value, new_prefix(), REPLACE),), 1))
    return groups


def _plan_merges(nodes: list[Node], position: Mapping[str, int], candidates: list[str],
                 sizes: Mapping[str, int], merge_size: int, slots: int,
                 new_prefix: Callable[[], str]) -> tuple[set[str], list[ResizeGroup]]:
    """Java's ``buildMergeClusteringGroup``: from every small group, grow a run backwards,
    then forwards, over ring-adjacent small groups while slots remain. As in Java, a step
    is taken while the run's size so far is within the threshold (the step's own group must
    be too), and both directions check adjacency against the *former* node — so only
    backward steps (and the ring's wrap) ever join."""
    if len(candidates) <= 1:
        return set(), []
    files = sorted(candidates, key=lambda f: nodes[position[f]].value)
    added = [False] * len(files)
    groups: list[ResizeGroup] = []
    n = len(files)
    for i in range(n):
        if added[i] or sizes[files[i]] > merge_size:
            continue
        bounds = [i, i]
        total = sizes[files[i]]
        for k in (0, 1):
            forward = k == 1
            while True:
                at = bounds[k]
                nxt = (at + 1) % n if forward else (at - 1) % n
                former = nodes[position[files[at]] - 1]
                neighbour = nodes[position[files[nxt]]] == former
                if (slots == 0 or added[nxt] or not neighbour or total > merge_size
                        or sizes[files[nxt]] > merge_size):
                    break
                total += sizes[files[nxt]]
                bounds[k] = nxt
                slots -= 1
                if bounds[k] == i:
                    break
        start, end = bounds
        if start == i and end == i:
            continue
        run = []
        while True:
            added[start] = True
            run.append(files[start])
            if start == end:
                break
            start = (start + 1) % n
        last = nodes[position[run[-1]]]
        children = tuple(Node(nodes[position[f]].value, nodes[position[f]].file_id_prefix,
                              DELETE) for f in run[:-1])
        groups.append(ResizeGroup(tuple(run),
                                  (*children, Node(last.value, new_prefix(), REPLACE)), 1))
    return {f for f, a in zip(files, added, strict=True) if a}, groups


def apply_children(ring: HashingMetadata, children: Sequence[Node],
                   instant: str) -> HashingMetadata:
    """The ring after a resize committed at ``instant``: ``REPLACE`` children take (or add)
    their value's node, ``DELETE`` children remove theirs; every node ``NORMAL``, ``seqNo``
    + 1, ``numBuckets`` unchanged (Java ``ConsistentBucketIndexUtils``)."""
    by_value = {n.value: n for n in ring.nodes}
    for child in children:
        if child.tag == DELETE:
            by_value.pop(child.value, None)
        else:
            by_value[child.value] = Node(child.value, child.file_id_prefix, NORMAL)
    return HashingMetadata(ring.partition_path, instant, ring.num_buckets, ring.seq_no + 1,
                           tuple(by_value.values()), ring.version)


def nodes_json(nodes: Sequence[Node]) -> str:
    """``ConsistentHashingNode.toJsonString``: the nodes as a compact JSON array."""
    return json.dumps([n.fields() for n in nodes], separators=(",", ":"))


def nodes_from_json(text: str) -> tuple[Node, ...]:
    """The nodes of a resize plan group's ``clustering.group.child.node``."""
    try:
        return tuple(Node(int(n["value"]), str(n["fileIdPrefix"]), str(n.get("tag") or NORMAL))
                     for n in json.loads(text))
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptTableError(f"clustering.group.child.node: {exc}") from exc

"""The file groups pending table-service plans hold: what the table view and the conflict
check at commit both ask (Hudi's ``CompactionUtils.getAllPendingCompactionOperations`` and
``ClusteringUtils.getAllFileGroupsInPendingClusteringPlans``, read from the timeline's plan
files, below the view and the writers)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from engine.errors import CorruptTableError
from engine.timeline.active import Timeline
from engine.timeline.commit_metadata import read_avro_ocf
from engine.timeline.instant import Instant

FileGroupId = tuple[str, str]
"""(partition path, file id)."""


def planned_groups(timeline: Timeline, instant: Instant) -> set[FileGroupId]:
    """File groups a pending compaction or clustering plan covers."""
    rel = f"{timeline.folder}/{instant.file_name(timeline.config.timeline_layout)}"
    requested = f"{timeline.folder}/{instant.requested_time}.{instant.action.value}.requested"
    for path in (requested, rel):
        try:
            data = timeline.storage.read(path)
        except FileNotFoundError:
            continue
        if not data:
            continue
        try:
            plan = read_avro_ocf(data)
        except (ValueError, OSError, EOFError) as exc:
            raise CorruptTableError(f"plan {path} cannot be read: {exc}") from exc
        return set(_plan_groups(plan))
    return set()


def _plan_groups(plan: Mapping[str, Any]) -> Iterator[FileGroupId]:
    # HoodieCompactionPlan: operations[].{partitionPath, fileId}
    for op in plan.get("operations") or []:
        yield str(op.get("partitionPath") or ""), str(op.get("fileId") or "")
    # HoodieRequestedReplaceMetadata: clusteringPlan.inputGroups[].slices[]
    clustering = plan.get("clusteringPlan") or {}
    for group in clustering.get("inputGroups") or []:
        for slc in group.get("slices") or []:
            yield str(slc.get("partitionPath") or ""), str(slc.get("fileId") or "")

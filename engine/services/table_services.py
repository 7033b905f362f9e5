"""Which table services are due after a write, and running them.

Two callers:

* the engine API (:meth:`engine.table.Table.upsert` and the other writes) runs
  :func:`run_inline` right after its commit: compaction and clustering when
  ``hoodie.compact.inline`` / ``hoodie.clustering.inline`` say so (or only scheduling them
  with the ``schedule.inline`` keys), then cleaning (``hoodie.clean.automatic``) and archival
  (``hoodie.archive.automatic``), in Hudi's order;
* the streaming job schedules what is due after each micro-batch
  (:func:`schedule_due`, under the lock) and executes it beside ingestion
  (:mod:`ingest.services`), with :func:`execute_pending`.

A service that fails after the write committed never undoes the write: :func:`run_inline`
logs the failure and the next write tries again (a pending plan is picked up where it was
left; a plan is never dropped).
"""

from __future__ import annotations

import datetime as _dt
import logging
from collections.abc import Sequence

from engine.config import TableConfig
from engine.services.archive import archives_automatically
from engine.services.base import ServiceRun, TaskRunner, local_runner
from engine.storage import Storage
from engine.timeline.active import Timeline
from engine.timeline.instant import Action
from engine.write.write_client import WriteClient

log = logging.getLogger(__name__)

COMPACTION = "compaction"
CLUSTERING = "clustering"
CLEAN = "clean"
ARCHIVE = "archive"


_PLAN_ACTIONS = {COMPACTION: Action.COMPACTION, CLUSTERING: Action.CLUSTERING}


def pending_plans(storage: Storage, config: TableConfig, services: Sequence[str]) -> int:
    """Plans of ``services`` (:data:`COMPACTION`, :data:`CLUSTERING`) not completed yet
    (requested or inflight), on the table's timeline as it is now."""
    actions = [_PLAN_ACTIONS[service] for service in services]
    return len(Timeline.load(storage, config).pending(actions))


def schedule_due(client: WriteClient, *, compaction: bool, clustering: bool,
                 clustering_inline: bool = False,
                 now: _dt.datetime | None = None,
                 timeline: Timeline | None = None) -> list[tuple[str, str]]:
    """Schedule a compaction and/or clustering plan if its trigger says one is due; returns
    (service, instant) of each plan written. Cheap when nothing is due (one timeline
    listing; none given ``timeline``, a recent snapshot the triggers are judged from:
    a plan is made under the lock from the timeline as it is then)."""
    from engine.services.clustering import clustering_due, schedule_clustering
    from engine.services.compaction import compaction_due, schedule_compaction

    scheduled: list[tuple[str, str]] = []
    if timeline is None:
        timeline = Timeline.load(client.storage, client.config)
    if compaction and client.config.is_mor and compaction_due(timeline, client.write_config,
                                                               now):
        instant = schedule_compaction(client)
        if instant is not None:
            scheduled.append((COMPACTION, instant))
    if clustering and clustering_due(timeline, client.write_config, inline=clustering_inline):
        instant = schedule_clustering(client)
        if instant is not None:
            scheduled.append((CLUSTERING, instant))
    return scheduled


def execute_pending(client: WriteClient, service: str, *,
                    runner: TaskRunner = local_runner,
                    timeline: Timeline | None = None) -> ServiceRun:
    """Run one service: execute every pending compaction or clustering plan, or clean, or
    archive. ``timeline``: a recent snapshot that cleaning and archival judge whether they
    are due from (listed now if None); compaction and clustering list the timeline."""
    if service == COMPACTION:
        from engine.services.compaction import run_compaction

        return run_compaction(client, runner=runner)
    if service == CLUSTERING:
        from engine.services.clustering import run_clustering

        return run_clustering(client, runner=runner)
    if service == CLEAN:
        from engine.services.clean import run_clean

        return run_clean(client, seen=timeline)
    if service == ARCHIVE:
        from engine.services.archive import run_archive

        return run_archive(client, seen=timeline)
    raise ValueError(f"service: expected compaction, clustering, clean or archive, got "
                     f"{service!r}")


def run_inline(client: WriteClient) -> list[ServiceRun]:
    """The services a write runs after its commit, as its options say (see the module doc).
    Failures are logged, not raised: the write is committed whatever happens here.

    What is due is judged from the timeline as the write's commit left it
    (:attr:`WriteClient.committed`) until a service changes the table: cleaning and
    archival that are not due then list nothing and take no lock; whatever they write,
    they decide under the lock from the timeline as it is then."""
    wc = client.write_config
    runs: list[ServiceRun] = []
    seen = client.committed
    compaction = client.config.is_mor and (wc.compact_inline or wc.compact_schedule_inline)
    clustering = wc.clustering_inline or wc.clustering_schedule_inline
    if compaction or clustering:
        try:
            if schedule_due(client, compaction=compaction, clustering=clustering,
                            clustering_inline=True, timeline=seen):
                seen = None
        except Exception:
            seen = None
            log.exception("%s: scheduling table services after the write failed; the next "
                          "write tries again", client.storage.base_path)
    steps = ((COMPACTION, client.config.is_mor and wc.compact_inline),
             (CLUSTERING, wc.clustering_inline), (CLEAN, wc.clean_automatic),
             (ARCHIVE, archives_automatically(client.config, wc)))
    for service, wanted in steps:
        if not wanted:
            continue
        try:
            run = execute_pending(client, service, timeline=seen)
        except Exception:
            seen = None
            log.exception("%s: %s after the write failed; the write is committed, the next "
                          "write tries again", client.storage.base_path, service)
            continue
        if run.did_something:
            runs.append(run)
            seen = None  # the table changed: the next service lists it anew
    return runs

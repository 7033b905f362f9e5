"""The commit protocol: how every action on a data table's timeline completes.

:func:`commit_instant` is the one way an instant of the data table completes — a write, a
compaction, a clustering, a clean, a rollback, a savepoint. Its order is Hudi's
(``BaseHoodieWriteClient.commit``: ``writeTableMetadata``, then the active timeline's
``saveAsComplete``; ``hudi-metadata-table.md`` §3.6, pitfall 1):

1. the action's files are written (by the caller, before);
2. the metadata table's deltacommit at **the same instant time** completes
   (:func:`engine.metadata.sync.sync_instant`) for every action that changes the file
   listing (commit, deltacommit, replacecommit, clean, rollback, restore), carrying what the
   action adds to the MDT's index partitions;
3. the data instant completes (:meth:`engine.timeline.active.Timeline.complete`) with a
   completion time later than the MDT deltacommit's.

A crash between 2 and 3 leaves an MDT deltacommit that readers ignore (its data instant is
not completed) and that the data instant's rollback removes. The timeline below knows
nothing of the metadata table: it completes an instant only with the
:class:`~engine.timeline.active.MetadataSynced` step 2 returns for that very instant, so no
caller completes a data action without the MDT in step.
"""

from __future__ import annotations

from engine.errors import InstantStateError
from engine.metadata.sync import sync_instant
from engine.metadata.update import MetadataUpdate
from engine.timeline.active import MetadataSynced, Timeline
from engine.timeline.instant import Instant, State


def commit_instant(timeline: Timeline, instant: Instant, content: bytes,
                   update: MetadataUpdate | None = None, *, listed: bool = False) -> Instant:
    """Complete the inflight ``instant`` with ``content`` (its completed file's bytes): the
    MDT deltacommit at the instant with ``update`` (what the action adds to the MDT's index
    partitions), then the completed instant; returns it. Hold the table lock, under which
    ``timeline`` was loaded (``listed``: see :meth:`Timeline.complete`)."""
    if instant.state is not State.INFLIGHT:  # (before the MDT hears of it)
        raise InstantStateError(f"{instant} is not inflight")
    synced = MetadataSynced(instant.requested_time,
                            sync_instant(timeline, instant, content, update))
    return timeline.complete(instant, content, synced, listed=listed)

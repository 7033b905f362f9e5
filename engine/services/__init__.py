"""Table services: rollback (compaction, clustering, cleaning, archival to come)."""

"""Table services: compaction, clustering, cleaning, archival, savepoints (rolling back,
which every writer does first, is :mod:`engine.write.rollback`)."""

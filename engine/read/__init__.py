"""Readers (snapshot, read-optimized, incremental, time travel) and the record merger."""

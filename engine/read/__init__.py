"""Readers (snapshot, read-optimized, incremental, time travel); they merge versions with
:mod:`engine.merge.record_merger`."""

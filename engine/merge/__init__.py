"""Merging versions of a record, as hudi-rs's ``crates/core/src/merge``: the record merger
(base file + log blocks, in-batch combine) and the write-side policy against stored versions
(the delete policies)."""

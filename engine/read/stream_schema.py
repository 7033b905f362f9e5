"""A running stream's schema against the schemas of the commits it reads next.

A streaming read fixes its schema when the query starts (Spark asks the source once); every
micro-batch is then delivered in that schema. When a writer evolves the table's schema
(:func:`engine.schema.evolve_schema`: a column added, a type widened; a Java writer with
schema-on-read may also drop or rename one), the rows of the commits after the change no
longer fit it: an added column would be dropped from every later batch, a widened one cast
back (and overflow). :func:`check_stream_schema` is the rule that refuses such a batch before
it is read, naming the commit that changed the schema, so the query fails and a restarted
query (which reads the table's new schema and replays the batch from its checkpoint) delivers
every value. Delta's streaming source does the same (``DeltaSource``'s read-compatibility
check of each metadata change in a batch's range, error ``DELTA_SCHEMA_CHANGED``: "Detected
schema change ... try restarting the query"); Hudi's streaming source keeps the schema it
started with and conforms later commits to it silently.

A change is judged between consecutive recorded schemas (a column the previous commit's schema
lacked, a type it held otherwise, a column it had), and refused only when the stream's schema
cannot carry it: a query restarted after the change has the new schema and replays older
commits into it (missing columns read null, narrower types widen), which loses nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from engine.errors import SchemaChangedError
from engine.read.scan import read_schema
from engine.schema import arrow_from_avro_json, is_widening
from engine.timeline.active import Timeline, completion_key

__all__ = ["check_stream_schema", "schema_change"]


def schema_change(before: pa.Schema, after: pa.Schema, stream: pa.Schema, *,
                  drops: bool = True, chosen: bool = False) -> tuple[str, str] | None:
    """How ``after`` (a commit's schema) changed ``before`` (the previous one) in a way a
    stream reading ``stream`` would lose values of: ``(column, what)`` for the first such
    column, None if there is none. ``drops``: also report a column of ``stream`` and
    ``before`` that ``after`` lacks (dropped or renamed). ``chosen``: the stream's columns
    are the ones its user asked for, so a column added outside them loses nothing."""
    for f in after:
        if f.name not in stream.names:
            if f.name not in before.names and not chosen:
                return f.name, f"was added (type {f.type})"
            continue  # a column the stream never had (a schema given by the user)
        held = stream.field(f.name).type
        if held.equals(f.type) or is_widening(f.type, held):
            continue
        if f.name in before.names and before.field(f.name).type.equals(f.type):
            continue  # unchanged: the stream's schema is the user's, not the table's
        return f.name, f"changed type from {held} to {f.type}"
    if drops:
        for f in before:
            if f.name not in after.names and f.name in stream.names:
                return f.name, "was dropped or renamed"
    return None


def check_stream_schema(timeline: Timeline, start: str | None, end: str, stream: pa.Schema,
                        normalize: Callable[[pa.Schema], pa.Schema] = lambda s: s, *,
                        chosen: bool = False) -> None:
    """Raise :class:`~engine.errors.SchemaChangedError` if a commit completed in
    (``start``, ``end``] (completion keys; ``start`` None: from the first commit) changed the
    table's schema in a way a stream in the schema ``stream`` cannot carry
    (:func:`schema_change`); the error names that commit and the column.

    Each recorded schema is taken as a read returns it (:func:`~engine.read.scan.read_schema`:
    meta fields first) and passed through ``normalize`` (the Spark glue maps it to the Arrow
    types Spark hands its batches in, as it did ``stream``). Before the range, the baseline is
    the schema of the latest commit completed at or before ``start``; without one (a stream
    from the first commit, or that commit archived) it is ``stream`` itself, checked for
    added and changed columns only (older commits lack the columns added since). ``chosen``:
    ``stream`` holds the columns its user asked for (:func:`schema_change`)."""
    populate = timeline.config.populate_meta_fields

    def recorded(schema_json: str) -> pa.Schema:
        return normalize(read_schema(arrow_from_avro_json(schema_json), populate))

    baseline: str | None = None
    in_range = []
    for instant in timeline.completed_data_instants:
        done = completion_key(instant)
        if done > end:
            break
        schema_json = timeline.commit_metadata(instant).schema
        if not schema_json:
            continue
        if start is not None and done <= start:
            baseline = schema_json
        else:
            in_range.append((instant, schema_json))
    if not in_range:
        return
    before, drops = (recorded(baseline), True) if baseline else (stream, False)
    for instant, schema_json in in_range:
        after = recorded(schema_json)
        change = schema_change(before, after, stream, drops=drops, chosen=chosen)
        if change is not None:
            column, what = change
            raise SchemaChangedError(
                f"the table's schema changed at instant {instant.requested_time} (completed "
                f"{completion_key(instant)}): column {column!r} {what}; this stream reads the "
                "schema it started with and would lose its values. Restart the query: it "
                "continues from its checkpoint and reads the new schema",
                instant.requested_time, column)
        before, drops = after, True

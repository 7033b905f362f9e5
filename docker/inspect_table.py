"""The demo's ``inspect`` service: what the job wrote, seen by tidelake and by hudi-rs.

``inspect_table.py [TABLE [ERROR_TABLE]]`` (defaults: the demo's ``/data/trips`` and
``/data/trips_errors``) prints ``tidelake table show`` of the table (row count, schema,
commits, table services, file groups, last checkpoint), the error table's rows by reason,
and the table read again with hudi-rs (the ``hudi`` package, in the inspect image only),
ending with a line saying whether both readers agree.
"""

from __future__ import annotations

import sys
from collections import Counter


def main(argv: list[str]) -> int:
    """Print the report; 0 when both readers agree, 1 otherwise, 2 without a table."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from engine import Table
    from engine.errors import TableNotFoundError
    from jobs.cli import main as tidelake

    path = argv[0] if argv else "/data/trips"
    errors_path = argv[1] if len(argv) > 1 else "/data/trips_errors"
    try:
        table = Table.open(path)
    except TableNotFoundError:
        print(f"no table at {path} yet: has the job committed? (docker compose logs job)")
        return 2
    code = tidelake(["table", "show", path, "--groups", "5"])
    if code:
        return code
    key = list(table.config.record_key_fields)
    ours = table.read(columns=key)

    print(f"\nerror table {errors_path}:")
    try:
        errors = Table.open(errors_path).read(columns=["reason"])
    except TableNotFoundError:
        print("  none (no malformed record so far)")
    else:
        reasons = Counter(r.split(":")[0] for r in errors.column("reason").to_pylist())
        print(f"  {errors.num_rows:,} records the job could not write, by reason:")
        for reason, n in reasons.most_common(8):
            print(f"  {n:>8,}  {reason[:90]}")

    print("\nhudi-rs (the hudi package) reads the same table:")
    try:
        from hudi import HudiTableBuilder
    except ImportError:
        print("  hudi-rs is not installed here (pip install hudi==0.5.0)")
        return 0
    batches = HudiTableBuilder.from_base_uri(path).build().read()
    theirs = pa.Table.from_batches(batches) if batches else pa.table({k: [] for k in key})
    same_keys = (sorted(pc.unique(theirs.column(key[0])).to_pylist())
                 == sorted(pc.unique(ours.column(key[0])).to_pylist()))
    agree = theirs.num_rows == ours.num_rows and same_keys
    print(f"  {theirs.num_rows:,} rows (tidelake reads {ours.num_rows:,}); "
          f"same keys: {'yes' if same_keys else 'NO'}")
    print(f"readers agree: {'yes' if agree else 'NO'}")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

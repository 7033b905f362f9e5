"""Test-only: arms the executor-side crash points (``decode``, ``tagging``,
``compaction_task``, ``clustering_task``) in every Python process of a crash-test job.

The crash test puts this folder on ``PYTHONPATH`` of the job it starts (and so of Spark's
Python workers, which inherit the job's environment) with ``TIDELAKE_TEST_CRASH_ARM`` and
``TIDELAKE_TEST_CRASH_SIGNAL`` set. Decoding runs inside the Kafka read tasks from the plain
prepare spec, so the decoders are wrapped where they run: in the worker processes, when a
process imports them (``job_child.install_executor_crash_points``: the job's other Python
processes do not pay for imports they never use). Nothing happens in a process without those
variables.
"""

import os

if os.environ.get("TIDELAKE_TEST_CRASH_ARM"):
    try:
        from tests.ingest.job_child import install_executor_crash_points
    except ImportError:  # not a process of the repo's job
        pass
    else:
        install_executor_crash_points(os.environ["TIDELAKE_TEST_CRASH_ARM"],
                                      os.environ["TIDELAKE_TEST_CRASH_SIGNAL"])

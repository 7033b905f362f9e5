"""Test-only: arms the executor-side crash points (``decode``, ``tagging``,
``compaction_task``, ``clustering_task``) in every Python process of a crash-test job.

The crash test puts this folder on ``PYTHONPATH`` of the job it starts (and so of Spark's
Python workers, which inherit the job's environment) with ``TIDELAKE_TEST_CRASH_ARM`` and
``TIDELAKE_TEST_CRASH_SIGNAL`` set. Decoding runs inside the Kafka read tasks from the plain
prepare spec, so the decoders are wrapped where they run: in the worker processes. Nothing
happens in a process without those variables.
"""

import os

if os.environ.get("TIDELAKE_TEST_CRASH_ARM"):
    try:
        from tests.ingest.job_child import (
            install_decode_crash_point,
            install_service_crash_points,
            install_tagging_crash_point,
        )
    except ImportError:  # not a process of the repo's job
        pass
    else:
        install_decode_crash_point(os.environ["TIDELAKE_TEST_CRASH_ARM"],
                                   os.environ["TIDELAKE_TEST_CRASH_SIGNAL"])
        install_tagging_crash_point(os.environ["TIDELAKE_TEST_CRASH_ARM"],
                                    os.environ["TIDELAKE_TEST_CRASH_SIGNAL"])
        install_service_crash_points(os.environ["TIDELAKE_TEST_CRASH_ARM"],
                                     os.environ["TIDELAKE_TEST_CRASH_SIGNAL"], executors=True)

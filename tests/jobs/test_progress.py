"""The job's progress, idle and summary lines, and the Kafka lag they show."""

from __future__ import annotations

import time

from jobs.progress import Progress, format_idle, format_progress, format_summary, kafka_lag


def _progress(**values: object) -> Progress:
    p = Progress(started=time.monotonic() - 100)
    for key, value in values.items():
        setattr(p, key, value)
    return p


def test_kafka_lag_sums_latest_minus_end_over_partitions() -> None:
    progress = {"sources": [{
        "endOffset": {"trips": {"0": 90, "1": 50}},
        "latestOffset": {"trips": {"0": 100, "1": 50, "2": 7}},
    }]}
    assert kafka_lag(progress) == 10 + 0 + 7
    as_text = {"sources": [{"endOffset": '{"t": {"0": 1}}', "latestOffset": '{"t": {"0": 4}}'}]}
    assert kafka_lag(as_text) == 3
    assert kafka_lag({"sources": [{"endOffset": None, "latestOffset": None}]}) is None
    assert kafka_lag(None) is None


def test_current_rate_covers_the_recent_window_not_the_whole_run() -> None:
    p = _progress()
    now = time.monotonic()
    p.samples.extend([(now - 60, 90_000), (now - 1, 100_000)])
    p.records = 100_000
    # the last batch came within the window: its records over the time since the one before
    assert 160 < p.current_rate(window=10) < 170  # 10,000 records in ~60 s
    assert 950 < p.rate() < 1_050  # 100,000 in 100 s
    p.samples.clear()
    p.samples.append((now - 60, 100_000))
    assert p.current_rate(window=10) == 0.0  # nothing new lately


def test_progress_line_shows_rates_lag_errors_and_counters_when_nonzero() -> None:
    p = _progress(batches=3, records=60_000, errors=12, file_groups=4, lag=1_234)
    line = format_progress(p)
    assert line.startswith("batch 3: 60,000 records, ")
    assert "/s now (" in line and line.endswith(
        "/s avg), lag 1,234, 12 errors, 4 file groups written")
    p.skipped, p.retries = 1, 2
    assert format_progress(p).endswith(
        ", 4 file groups written, 1 replayed batches skipped, 2 commit retries")
    assert ", lag ?," in format_progress(_progress(batches=1))


def test_idle_and_summary_lines() -> None:
    p = _progress(batches=3, records=50_000, errors=388, lag=0)
    assert format_idle(p, 30) == "idle 30 s: waiting for new records; 50,000 records in 3 " \
        "batches so far"
    assert format_idle(p, 45, busy=True) == ("batch 4 still running after 45 s, lag 0; "
                                             "50,000 records in 3 batches so far")
    assert format_summary(p, "--duration reached") == (
        "stopped (--duration reached) after 100 s: 50,000 records in 3 batches (500/s avg), "
        "388 errors, lag 0")

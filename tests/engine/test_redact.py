"""One list of secret markers and one redaction rule (``engine/redact.py``), used everywhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.redact import REDACTED, SECRET_MARKERS, is_secret_key, redact, spark_redaction_regex

REPO = Path(__file__).resolve().parents[2]

SECRET_KEYS = [
    "kafka.sasl.plain.password", "kafka.ssl.key.password", "kafka.sasl.jaas.config",
    "spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net",
    "spark.hadoop.fs.s3a.access.key", "spark.hadoop.fs.s3a.secret.key",
    "spark.hadoop.fs.s3a.session.token", "fs.gs.auth.service.account.private.key.id",
    "spark.hadoop.fs.azure.account.oauth2.client.credential", "API_KEY", "MyPrivate",
]
PLAIN_KEYS = ["spark.sql.shuffle.partitions", "subscribe", "kafka.bootstrap.servers",
              "spark.master", "hoodie.logfile.data.block.format"]


@pytest.mark.parametrize("key", SECRET_KEYS)
def test_is_secret_key_secret_keys_are_secret(key: str) -> None:
    assert is_secret_key(key)
    assert redact({key: "hunter2", "plain": "v"}) == {key: REDACTED, "plain": "v"}


@pytest.mark.parametrize("key", PLAIN_KEYS)
def test_is_secret_key_plain_keys_are_shown(key: str) -> None:
    assert not is_secret_key(key)


def test_spark_redaction_regex_matches_what_is_secret_key_matches() -> None:
    regex = spark_redaction_regex(extra=("tidelake.prepare",))
    assert regex.startswith("(?i)")
    pattern = re.compile(regex.removeprefix("(?i)"), re.IGNORECASE)
    for key in SECRET_KEYS + PLAIN_KEYS:
        assert bool(pattern.search(key)) == is_secret_key(key), key
    assert pattern.search("tidelake.prepare") and not pattern.search("tidelakeXprepare")


def test_secret_markers_are_listed_once_in_the_code() -> None:
    """Every module redacts through engine.redact: no other list of markers exists."""
    others = []
    for folder in ("engine", "ingest", "jobs"):
        for source in (REPO / folder).rglob("*.py"):
            if source.name == "redact.py":
                continue
            text = source.read_text(encoding="utf-8").lower()
            if re.search(r"""["']password["']""", text):
                others.append(str(source.relative_to(REPO)))
    assert others == [], f"secret markers listed outside engine/redact.py: {others}"
    assert "key" in SECRET_MARKERS and "credential" in SECRET_MARKERS

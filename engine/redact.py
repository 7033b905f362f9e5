"""Secrets in configuration: one list of markers, one redaction rule, used everywhere.

A key is *secret* when it contains one of :data:`SECRET_MARKERS`, case-insensitively, anywhere
(``kafka.sasl.plain.password``, ``kafka.sasl.jaas.config``, ``spark.hadoop.fs.s3a.secret.key``,
``spark.hadoop.fs.azure.account.key.<account>.dfs.core.windows.net``,
``fs.gs.auth.service.account.private.key.id``, ``...oauth2.client.credential``). Matching is
deliberately broad: hiding a harmless value costs a reader little, showing a secret cannot be
undone. Every place that prints, logs or shows options — the Kafka source's options and plans,
the job config, the Spark session's redaction settings — uses :func:`is_secret_key`,
:func:`redact` or :func:`spark_redaction_regex`; storage credentials will use them too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["REDACTED", "SECRET_MARKERS", "is_secret_key", "redact", "spark_redaction_regex"]

SECRET_MARKERS = ("password", "secret", "token", "credential", "private", "jaas", "key")
"""Substrings that make a configuration key secret (compared in lower case)."""

REDACTED = "*********(redacted)"
"""What a secret value is shown as (Spark's own replacement text)."""


def is_secret_key(key: str) -> bool:
    """True for keys whose values must never be shown (see :data:`SECRET_MARKERS`)."""
    lowered = str(key).lower()
    return any(marker in lowered for marker in SECRET_MARKERS)


def redact(options: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``options`` with the value of every secret key replaced by :data:`REDACTED`."""
    return {k: REDACTED if is_secret_key(k) else v for k, v in options.items()}


def spark_redaction_regex(extra: Iterable[str] = ()) -> str:
    """A Java regex matching what :func:`is_secret_key` matches (plus the literal ``extra``
    keys), for Spark's ``spark.redaction.regex`` and ``spark.sql.redaction.options.regex``."""
    return "(?i)" + "|".join(re.escape(m) for m in (*SECRET_MARKERS, *extra))

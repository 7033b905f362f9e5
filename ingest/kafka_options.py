"""Options of the ``tidelake-kafka`` source: parsed and checked once, secrets kept hidden.

:class:`KafkaSourceOptions` turns Spark's case-insensitive string options (listed in
:mod:`ingest.kafka_source`) into a frozen, picklable value; an unknown or malformed key raises
:class:`~engine.errors.InvalidOptionError` naming it. Values of keys that look secret
(:func:`is_secret_key`) never appear in ``repr`` or messages. No Spark needed here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from engine.errors import InvalidOptionError
from engine.redact import REDACTED as _REDACTED
from engine.redact import is_secret_key, redact
from ingest.kafka_offsets import Offsets, is_topic_name, offsets_from_json_dict

__all__ = [
    "CLIENT_OPTIONS",
    "SOURCE_NAME",
    "KafkaSourceOptions",
    "is_secret_key",
    "redact_options",
]

SOURCE_NAME = "tidelake-kafka"


def redact_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``options`` with secret values replaced (:func:`engine.redact.redact`) and
    the long prepare step shortened, for printing."""
    return {k: "(a prepare step)" if k.lower() == "tidelake.prepare" else v
            for k, v in redact(options).items()}


def _text(key: str, value: str) -> str:
    if not value.strip():
        raise InvalidOptionError(key, "must not be empty")
    return value.strip()


def _boolean(key: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        shown = _REDACTED if is_secret_key(key) else repr(value)
        raise InvalidOptionError(key, f"expected true or false, got {shown}")
    return lowered == "true"


def _positive_int(key: str, value: str) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        number = 0
    if number <= 0:
        raise InvalidOptionError(key, f"expected a positive integer, got {value!r}")
    return number


def _one_of(*choices: str, upper: bool = True) -> Callable[[str, str], str]:
    """A parser accepting exactly ``choices`` (case-insensitively); anything else is an error
    naming the option and the accepted values, so a typo never falls back to a default (a
    misspelt ``SASL_PLAINTXT`` must not connect in plaintext without authentication)."""

    def parse(key: str, value: str) -> str:
        text = _text(key, value)
        wanted = text.upper() if upper else text.lower()
        if wanted not in choices:
            raise InvalidOptionError(key, f"expected one of {', '.join(choices)}, got {text!r}")
        return wanted

    return parse


def _servers(key: str, value: str) -> list[str]:
    servers = [s.strip() for s in value.split(",") if s.strip()]
    if not servers:
        raise InvalidOptionError(key, "expected host:port[,host:port...]")
    return servers


def _hostname_check(key: str, value: str) -> bool:
    # Java's ssl.endpoint.identification.algorithm: "https" checks the host name, "" does not.
    lowered = value.strip().lower()
    if lowered not in ("https", ""):
        raise InvalidOptionError(key, f"expected https or an empty string, got {value!r}")
    return lowered == "https"


SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
"""The SASL mechanisms that string options can configure (username and password); GSSAPI and
OAUTHBEARER need objects or Kerberos settings the source does not take."""
ISOLATION_LEVELS = ("read_committed", "read_uncommitted")


CLIENT_OPTIONS: dict[str, tuple[str, Callable[[str, str], Any]]] = {
    "kafka.bootstrap.servers": ("bootstrap_servers", _servers),
    "kafka.security.protocol": ("security_protocol", _one_of(*SECURITY_PROTOCOLS)),
    "kafka.sasl.mechanism": ("sasl_mechanism", _one_of(*SASL_MECHANISMS)),
    "kafka.sasl.plain.username": ("sasl_plain_username", _text),
    "kafka.sasl.plain.password": ("sasl_plain_password", _text),
    "kafka.ssl.cafile": ("ssl_cafile", _text),
    "kafka.ssl.certfile": ("ssl_certfile", _text),
    "kafka.ssl.keyfile": ("ssl_keyfile", _text),
    "kafka.ssl.password": ("ssl_password", _text),
    "kafka.ssl.key.password": ("ssl_password", _text),
    "kafka.ssl.crlfile": ("ssl_crlfile", _text),
    "kafka.ssl.ciphers": ("ssl_ciphers", _text),
    "kafka.ssl.check.hostname": ("ssl_check_hostname", _boolean),
    "kafka.ssl.endpoint.identification.algorithm": ("ssl_check_hostname", _hostname_check),
    "kafka.client.id": ("client_id", _text),
    "kafka.request.timeout.ms": ("request_timeout_ms", _positive_int),
    "kafka.isolation.level": ("isolation_level", _one_of(*ISOLATION_LEVELS, upper=False)),
}
"""``kafka.*`` option -> (kafka-python ``KafkaConsumer`` argument, parser). SSL takes PEM files.
Enumerated settings accept only their listed values."""

_SET_BY_SOURCE = {
    "kafka.auto.offset.reset": "use startingOffsets (source.starting_offsets in a job)",
    "kafka.group.id": "the source keeps offsets in the Spark checkpoint, not in a group",
    "kafka.enable.auto.commit": "the source never commits offsets to Kafka",
    "kafka.key.deserializer": "keys are read as bytes",
    "kafka.value.deserializer": "values are read as bytes; see the decode settings",
}
"""Kafka consumer settings the source sets itself (as Spark's kafka source refuses them)."""

_SOURCE_OPTIONS = {
    "subscribe": "subscribe",
    "startingoffsets": "startingOffsets",
    "maxoffsetspertrigger": "maxOffsetsPerTrigger",
    "failondataloss": "failOnDataLoss",
    "kafkaconsumer.polltimeoutms": "kafkaConsumer.pollTimeoutMs",
    "fastdecode": "fastDecode",
    "tidelake.prepare": "tidelake.prepare",
}


@dataclass(frozen=True, repr=False)
class KafkaSourceOptions:
    """The source's options, parsed and checked once; picklable; ``repr`` hides secrets."""

    topics: tuple[str, ...]
    starting_offsets: str | Offsets
    """``"earliest"``, ``"latest"``, or per-partition offsets (-2 earliest, -1 latest)."""
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    poll_timeout_ms: int
    client_config: dict[str, Any]
    """kafka-python ``KafkaConsumer`` arguments from the ``kafka.*`` options."""
    fast_decode: bool = True
    """Decode fetched record batches whole (:mod:`ingest.kafka_records`)."""
    prepare: str | None = None
    """The sink's prepare step to run in the read tasks (``tidelake.prepare``: an encoded
    :class:`~ingest.prepare.PrepareSpec`, see :func:`ingest.kafka_source.prepare_option`)."""

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> KafkaSourceOptions:
        """Parse Spark-style string options; unknown or malformed keys raise, naming the key."""
        lowered: dict[str, str] = {}
        for key, value in options.items():
            if key.lower() in lowered:
                raise InvalidOptionError(key, "given twice (option keys are case-insensitive)")
            lowered[key.lower()] = str(value)
        client: dict[str, Any] = {}
        source: dict[str, str] = {}
        for key, value in lowered.items():
            if key in CLIENT_OPTIONS:
                arg, parse = CLIENT_OPTIONS[key]
                client[arg] = parse(key, value)
            elif key in _SET_BY_SOURCE:
                raise InvalidOptionError(key, f"cannot be set: {_SET_BY_SOURCE[key]}")
            elif key.startswith("kafka."):
                hint = " (kafka-python takes PEM files: kafka.ssl.cafile, certfile, keyfile)"
                raise InvalidOptionError(
                    key, "unknown Kafka client option" + (hint if ".ssl." in key else "")
                    + f"; supported: {', '.join(sorted(CLIENT_OPTIONS))}")
            elif key in _SOURCE_OPTIONS:
                source[_SOURCE_OPTIONS[key]] = value
            else:
                raise InvalidOptionError(
                    key, f"unknown option of the {SOURCE_NAME} source; supported: "
                    f"{', '.join(sorted(_SOURCE_OPTIONS.values()))} and kafka.* client options")
        if "bootstrap_servers" not in client:
            raise InvalidOptionError("kafka.bootstrap.servers", "is required")
        protocol = client.get("security_protocol", "PLAINTEXT")
        if protocol.startswith("SASL_"):
            if "sasl_mechanism" not in client:
                raise InvalidOptionError("kafka.sasl.mechanism", f"is required with "
                                         f"security.protocol {protocol} (one of "
                                         f"{', '.join(SASL_MECHANISMS)})")
            for needed in ("sasl_plain_username", "sasl_plain_password"):
                if needed not in client:
                    raise InvalidOptionError(
                        "kafka." + needed.replace("_", ".", 2),
                        f"is required with sasl.mechanism {client['sasl_mechanism']}")
        elif "sasl_mechanism" in client:
            raise InvalidOptionError("kafka.sasl.mechanism", f"has no effect with "
                                     f"security.protocol {protocol}; use SASL_PLAINTEXT or "
                                     "SASL_SSL to authenticate")
        if "subscribe" not in source:
            raise InvalidOptionError("subscribe", "is required (comma-separated topic names)")
        topics = tuple(dict.fromkeys(t.strip() for t in source["subscribe"].split(",")))
        bad = [t for t in topics if not is_topic_name(t)]
        if bad:
            raise InvalidOptionError("subscribe", f"invalid topic name(s) {bad}")
        limit = source.get("maxOffsetsPerTrigger")
        return cls(
            topics=topics,
            starting_offsets=_parse_starting_offsets(source.get("startingOffsets", "latest"),
                                                     topics),
            max_offsets_per_trigger=None if limit is None else _positive_int(
                "maxOffsetsPerTrigger", limit),
            fail_on_data_loss=_boolean("failOnDataLoss", source.get("failOnDataLoss", "true")),
            poll_timeout_ms=_positive_int(
                "kafkaConsumer.pollTimeoutMs", source.get("kafkaConsumer.pollTimeoutMs", "120000")),
            client_config=client,
            fast_decode=_boolean("fastDecode", source.get("fastDecode", "true")),
            prepare=source.get("tidelake.prepare") or None,
        )

    def consumer_config(self, **overrides: Any) -> dict[str, Any]:
        """Arguments for a group-less ``KafkaConsumer`` that never commits or creates topics."""
        return {
            "group_id": None,
            "enable_auto_commit": False,
            "allow_auto_create_topics": False,
            # Records of aborted transactions are never ingested (``kafka.isolation.level``).
            "isolation_level": "read_committed",
            **self.client_config,
            **overrides,
        }

    def __repr__(self) -> str:
        client = redact_options(self.client_config)
        return (f"KafkaSourceOptions(topics={self.topics!r}, "
                f"starting_offsets={self.starting_offsets!r}, "
                f"max_offsets_per_trigger={self.max_offsets_per_trigger!r}, "
                f"fail_on_data_loss={self.fail_on_data_loss!r}, client_config={client!r})")


def _parse_starting_offsets(value: str, topics: tuple[str, ...]) -> str | Offsets:
    key = "startingOffsets"
    text = value.strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        parsed = json.loads(text)
        offsets = offsets_from_json_dict(parsed)
    except (ValueError, TypeError, AttributeError) as exc:
        raise InvalidOptionError(
            key, f"expected earliest, latest or JSON like {{\"topic\": {{\"0\": 23}}}}: {exc}"
        ) from None
    for topic, parts in offsets.items():
        if topic not in topics:
            raise InvalidOptionError(key, f"topic '{topic}' is not in subscribe")
        for partition, offset in parts.items():
            if partition < 0 or offset < -2:
                raise InvalidOptionError(key, f"bad offset {offset} for {topic}-{partition}")
    return offsets

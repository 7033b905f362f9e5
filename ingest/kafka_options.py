"""Options of the ``tidelake-kafka`` source: parsed and checked once, secrets kept hidden.

Every option is declared once, with its parser, default and doc: the source's own options are
the fields of :class:`KafkaSourceOptions` (:func:`engine.config.option`, :data:`SOURCE_KEYS`),
the ``kafka.*`` client settings are :data:`CLIENT_KEYS`; docs/configuration.md lists both.
:class:`KafkaSourceOptions` turns Spark's case-insensitive string options into a frozen,
picklable value; an unknown or malformed key raises :class:`~engine.errors.InvalidOptionError`
naming it. Values of keys that look secret
(:func:`is_secret_key`) never appear in ``repr`` or messages. No Spark needed here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from engine.config import ConfigKey, option
from engine.errors import InvalidOptionError
from engine.redact import REDACTED as _REDACTED
from engine.redact import is_secret_key, redact
from ingest.kafka_offsets import Offsets, is_topic_name, offsets_from_json_dict

__all__ = [
    "CLIENT_KEYS",
    "CLIENT_OPTIONS",
    "SOURCE_KEYS",
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


SOURCE_GROUP = "kafka source"
CLIENT_GROUP = "kafka client"
"""The docs tables (:func:`engine.config.describe_options`) of the two kinds of option."""

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
"""The SASL mechanisms that string options can configure (username and password); GSSAPI and
OAUTHBEARER need objects or Kerberos settings the source does not take."""
ISOLATION_LEVELS = ("read_committed", "read_uncommitted")


CLIENT_KEYS: tuple[ConfigKey[Any], ...] = (
    ConfigKey("kafka.bootstrap.servers", _servers, None, "`host:port[,host:port...]`.",
              attr="bootstrap_servers", group=CLIENT_GROUP, shown="required"),
    ConfigKey("kafka.security.protocol", _one_of(*SECURITY_PROTOCOLS), "PLAINTEXT",
              f"{', '.join(SECURITY_PROTOCOLS)}.", attr="security_protocol", group=CLIENT_GROUP),
    ConfigKey("kafka.sasl.mechanism", _one_of(*SASL_MECHANISMS), None,
              f"{', '.join(SASL_MECHANISMS)}: required with `SASL_*`, with "
              "`kafka.sasl.plain.username` and `kafka.sasl.plain.password`; refused without "
              "`SASL_*`.", attr="sasl_mechanism", group=CLIENT_GROUP),
    ConfigKey("kafka.sasl.plain.username", _text, None, "SASL user name.",
              attr="sasl_plain_username", group=CLIENT_GROUP),
    ConfigKey("kafka.sasl.plain.password", _text, None, "SASL password.",
              attr="sasl_plain_password", group=CLIENT_GROUP),
    ConfigKey("kafka.ssl.cafile", _text, None, "PEM file of the certificate authorities.",
              attr="ssl_cafile", group=CLIENT_GROUP),
    ConfigKey("kafka.ssl.certfile", _text, None, "PEM file of the client certificate.",
              attr="ssl_certfile", group=CLIENT_GROUP),
    ConfigKey("kafka.ssl.keyfile", _text, None, "PEM file of the client key.",
              attr="ssl_keyfile", group=CLIENT_GROUP),
    ConfigKey("kafka.ssl.password", _text, None, "Password of the client key.",
              aliases=("kafka.ssl.key.password",), attr="ssl_password", group=CLIENT_GROUP),
    ConfigKey("kafka.ssl.crlfile", _text, None, "PEM file of revoked certificates.",
              attr="ssl_crlfile", group=CLIENT_GROUP),
    ConfigKey("kafka.ssl.ciphers", _text, None, "Allowed ciphers (OpenSSL cipher list).",
              attr="ssl_ciphers", group=CLIENT_GROUP),
    ConfigKey("kafka.ssl.check.hostname", _boolean, None,
              "Check the broker's host name against its certificate.",
              attr="ssl_check_hostname", shown="kafka-python's (`true`)", group=CLIENT_GROUP),
    ConfigKey("kafka.ssl.endpoint.identification.algorithm", _hostname_check, None,
              "Java's spelling of the same: `https` checks the host name, an empty string "
              "does not.", attr="ssl_check_hostname", group=CLIENT_GROUP),
    ConfigKey("kafka.client.id", _text, None, "Client id the broker logs.", attr="client_id",
              shown="kafka-python's", group=CLIENT_GROUP),
    ConfigKey("kafka.request.timeout.ms", _positive_int, None,
              "Request timeout of the consumer.", attr="request_timeout_ms",
              shown="kafka-python's", group=CLIENT_GROUP),
    ConfigKey("kafka.isolation.level", _one_of(*ISOLATION_LEVELS, upper=False),
              "read_committed",
              "`read_committed`: records of aborted transactions are skipped (Spark's own "
              "source defaults to `read_uncommitted`).", attr="isolation_level",
              group=CLIENT_GROUP),
)
"""The ``kafka.*`` client settings the source supports: the kafka-python ``KafkaConsumer``
argument each sets (``attr``), its parser, default and doc. SSL takes PEM files. Enumerated
settings accept only their listed values."""

CLIENT_OPTIONS: dict[str, tuple[str, Callable[[str, str], Any]]] = {
    key: (spec.attr, spec.parse) for spec in CLIENT_KEYS for key in (spec.key, *spec.aliases)}
"""``kafka.*`` option (and alias) -> (kafka-python ``KafkaConsumer`` argument, parser), from
:data:`CLIENT_KEYS`."""
_CLIENT_DEFAULTS = {spec.attr: spec.default for spec in CLIENT_KEYS}

_SET_BY_SOURCE = {
    "kafka.auto.offset.reset": "use startingOffsets (source.starting_offsets in a job)",
    "kafka.group.id": "the source keeps offsets in the Spark checkpoint, not in a group",
    "kafka.enable.auto.commit": "the source never commits offsets to Kafka",
    "kafka.key.deserializer": "keys are read as bytes",
    "kafka.value.deserializer": "values are read as bytes; see the decode settings",
}
"""Kafka consumer settings the source sets itself (as Spark's kafka source refuses them)."""

def _topics(key: str, value: str) -> tuple[str, ...]:
    topics = tuple(dict.fromkeys(t.strip() for t in value.split(",")))
    bad = [t for t in topics if not is_topic_name(t)]
    if bad:
        raise InvalidOptionError(key, f"invalid topic name(s) {bad}")
    return topics


def _prepare(key: str, value: str) -> str | None:
    return value or None


_LATEST: str | Offsets = "latest"


@dataclass(frozen=True, repr=False)
class KafkaSourceOptions:
    """The source's options, parsed and checked once; picklable; ``repr`` hides secrets.

    Each field but ``client_config`` is one option of the source, declared here once
    (:func:`engine.config.option`: key, parser, default, doc); :data:`SOURCE_KEYS` lists them.
    """

    topics: tuple[str, ...] = option(
        "subscribe", _topics, (), "Comma-separated topic names (they must exist).",
        shown="required", group=SOURCE_GROUP)
    starting_offsets: str | Offsets = option(
        "startingOffsets", lambda k, v: _parse_starting_offsets(v), _LATEST,
        "`latest`, `earliest`, or JSON `{\"topic\": {\"0\": 23, \"1\": -2}}` (-2 earliest, -1 "
        "latest; partitions left out start at their earliest offset).", group=SOURCE_GROUP)
    """``"earliest"``, ``"latest"``, or per-partition offsets (-2 earliest, -1 latest)."""
    max_offsets_per_trigger: int | None = option(
        "maxOffsetsPerTrigger", _positive_int, None,
        "Offsets per micro-batch over all partitions, split in proportion to each partition's "
        "backlog (`availableNow` honours it too); unset: no limit.", group=SOURCE_GROUP)
    fail_on_data_loss: bool = option(
        "failOnDataLoss", _boolean, True,
        "`true`: fail when wanted offsets are gone (retention, topic recreated); `false`: log "
        "a warning and skip them.", group=SOURCE_GROUP)
    poll_timeout_ms: int = option(
        "kafkaConsumer.pollTimeoutMs", _positive_int, 120000,
        "How long a read task waits for records it knows exist.", group=SOURCE_GROUP)
    fast_decode: bool = option(
        "fastDecode", _boolean, True,
        "`true`: decode fetched record batches whole (`ingest/kafka_records.py`); `false`: "
        "kafka-python's record-by-record decoding.", group=SOURCE_GROUP)
    """Decode fetched record batches whole (:mod:`ingest.kafka_records`)."""
    prepare: str | None = option(
        "tidelake.prepare", _prepare, None,
        "Set by `read_kafka_stream(..., prepare=sink.spec)`, not by hand: the read tasks run "
        "the sink's prepare step and yield prepared rows, not Kafka rows.", group=SOURCE_GROUP)
    """The sink's prepare step to run in the read tasks (``tidelake.prepare``: an encoded
    :class:`~ingest.prepare.PrepareSpec`, see :func:`ingest.kafka_source.prepare_option`)."""
    client_config: dict[str, Any] = field(default_factory=dict)
    """kafka-python ``KafkaConsumer`` arguments from the ``kafka.*`` options."""

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
            elif key in _SOURCE_BY_LOWER:
                source[_SOURCE_BY_LOWER[key].key] = value
            else:
                raise InvalidOptionError(
                    key, f"unknown option of the {SOURCE_NAME} source; supported: "
                    f"{', '.join(sorted(s.key for s in SOURCE_KEYS))} and kafka.* client "
                    "options")
        if "bootstrap_servers" not in client:
            raise InvalidOptionError("kafka.bootstrap.servers", "is required")
        protocol = client.get("security_protocol", _CLIENT_DEFAULTS["security_protocol"])
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
        values: dict[str, Any] = {}
        for spec in SOURCE_KEYS:  # in declaration order: subscribe first
            raw = source.get(spec.key)
            values[spec.attr] = spec.default if raw is None else spec.parse(spec.key, raw)
            if spec.attr == "starting_offsets":
                _check_offsets_of(values["starting_offsets"], values["topics"])
        return cls(**values, client_config=client)

    def consumer_config(self, **overrides: Any) -> dict[str, Any]:
        """Arguments for a group-less ``KafkaConsumer`` that never commits or creates topics."""
        return {
            "group_id": None,
            "enable_auto_commit": False,
            "allow_auto_create_topics": False,
            # Records of aborted transactions are never ingested (``kafka.isolation.level``).
            "isolation_level": _CLIENT_DEFAULTS["isolation_level"],
            **self.client_config,
            **overrides,
        }

    def __repr__(self) -> str:
        client = redact_options(self.client_config)
        return (f"KafkaSourceOptions(topics={self.topics!r}, "
                f"starting_offsets={self.starting_offsets!r}, "
                f"max_offsets_per_trigger={self.max_offsets_per_trigger!r}, "
                f"fail_on_data_loss={self.fail_on_data_loss!r}, client_config={client!r})")


SOURCE_KEYS: tuple[ConfigKey[Any], ...] = tuple(
    replace(f.metadata["option"], attr=f.name) for f in fields(KafkaSourceOptions)
    if "option" in f.metadata)
"""The source's own options (not ``kafka.*``), from the :class:`KafkaSourceOptions` fields."""
_SOURCE_BY_LOWER = {spec.key.lower(): spec for spec in SOURCE_KEYS}


def _parse_starting_offsets(value: str) -> str | Offsets:
    key = "startingOffsets"
    text = value.strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        parsed = json.loads(text)
        return offsets_from_json_dict(parsed)
    except (ValueError, TypeError, AttributeError) as exc:
        raise InvalidOptionError(
            key, f"expected earliest, latest or JSON like {{\"topic\": {{\"0\": 23}}}}: {exc}"
        ) from None


def _check_offsets_of(offsets: str | Offsets, topics: tuple[str, ...]) -> None:
    """Per-partition ``startingOffsets`` name only subscribed topics and valid offsets."""
    key = "startingOffsets"
    if isinstance(offsets, str):
        return
    for topic, parts in offsets.items():
        if topic not in topics:
            raise InvalidOptionError(key, f"topic '{topic}' is not in subscribe")
        for partition, offset in parts.items():
            if partition < 0 or offset < -2:
                raise InvalidOptionError(key, f"bad offset {offset} for {topic}-{partition}")

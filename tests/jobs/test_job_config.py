"""The ingest job's TOML configuration and its flag overrides."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from engine.errors import InvalidOptionError
from jobs.job_config import add_flags, describe, load, overrides_from

ROOT = Path(__file__).resolve().parents[2]

GOOD = """
[source]
bootstrap_servers = "localhost:9092"
topics = ["trips"]
[source.kafka]
"security.protocol" = "SASL_PLAINTEXT"
"sasl.mechanism" = "SCRAM-SHA-512"
"sasl.plain.username" = "ingest"
"sasl.plain.password" = "hunter2"
[decode]
schema = "id STRING, ts BIGINT"
[table]
path = "/tmp/t"
record_key = ["id"]
precombine = "ts"
[table.options]
"hoodie.logfile.data.block.format" = "parquet"
[checkpoint]
location = "/tmp/cp"
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


def test_load_good_file_types_values_and_passthrough(tmp_path: Path) -> None:
    config = load(_write(tmp_path, GOOD))
    assert config["source.topics"] == ("trips",)
    assert config["source.max_offsets_per_trigger"] == 200000
    assert config["index.type"] == "BUCKET"
    assert config.kafka["security.protocol"] == "SASL_PLAINTEXT"
    assert config.table_options == {"hoodie.logfile.data.block.format": "parquet"}


def test_secrets_are_redacted_when_printed(tmp_path: Path) -> None:
    config = load(_write(tmp_path, GOOD))
    shown = str(config.redacted())
    assert "hunter2" not in shown
    assert "source.kafka.sasl.plain.password" in shown


def test_redacted_cloud_storage_key_in_spark_conf_is_hidden(tmp_path: Path) -> None:
    key = "spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net"
    config = load(_write(tmp_path, GOOD), {f"spark.conf.{key}": "c2VjcmV0LWtleQ==",
                                           "spark.conf.spark.master.hint": "x"})
    shown = config.redacted()
    assert shown[f"spark.conf.{key}"] == "*********(redacted)"
    assert "c2VjcmV0LWtleQ==" not in str(shown)
    with pytest.raises(InvalidOptionError) as caught:
        load(_write(tmp_path, GOOD), {"source.kafka.sasl.plain.password": ["hunter3"]})
    assert "hunter3" not in str(caught.value)


@pytest.mark.parametrize(("override", "named"), [
    ({"source.bogus": 1}, "source.bogus"),
    ({"index.num_buckets": "many"}, "index.num_buckets"),
    ({"index.type": "HASH"}, "index.type"),
    ({"source.fail_on_data_loss": "perhaps"}, "source.fail_on_data_loss"),
])
def test_unknown_or_malformed_setting_error_names_it(tmp_path: Path, override: dict[str, object],
                                                     named: str) -> None:
    with pytest.raises(InvalidOptionError, match=named.replace(".", r"\.")):
        load(_write(tmp_path, GOOD), override)


def test_unknown_section_in_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidOptionError, match=r"sauce\.x"):
        load(_write(tmp_path, GOOD + "[sauce]\nx = 1\n"))


def test_missing_required_setting_is_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidOptionError, match=r"checkpoint\.location"):
        load(_write(tmp_path, GOOD.replace('location = "/tmp/cp"', "")))


def test_flags_override_file_values(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    add_flags(parser)
    args = parser.parse_args([str(_write(tmp_path, GOOD)), "--index.num_buckets", "8",
                              "--source.topics", "a,b",
                              "--set", "spark.conf.spark.sql.shuffle.partitions=3"])
    config = load(args.config, overrides_from(args))
    assert config["index.num_buckets"] == 8
    assert config["source.topics"] == ("a", "b")
    assert config.spark_conf == {"spark.sql.shuffle.partitions": "3"}


@pytest.mark.parametrize(("kafka", "named", "says"), [
    ({"security.protocol": "SASL_PLAINTXT"}, "source.kafka.security.protocol",
     "expected one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL, got 'SASL_PLAINTXT'"),
    ({"security.protocol": "PLAINTEXT"}, "source.kafka.sasl.mechanism", "has no effect"),
    ({"isolation.level": "read_commited"}, "source.kafka.isolation.level", "read_committed"),
    ({"securty.protocol": "SSL"}, "source.kafka.securty.protocol",
     "unknown Kafka client option"),
    ({"auto.offset.reset": "earliest"}, "source.kafka.auto.offset.reset",
     "source.starting_offsets"),
])
def test_load_kafka_option_typo_error_names_job_setting(
        tmp_path: Path, kafka: dict[str, str], named: str, says: str) -> None:
    """Checked when the file is loaded, before any Spark session exists."""
    with pytest.raises(InvalidOptionError) as caught:
        load(_write(tmp_path, GOOD), {f"source.kafka.{k}": v for k, v in kafka.items()})
    assert caught.value.key == named
    assert f"option '{named}': " in str(caught.value)
    assert says in str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_load_bad_starting_offsets_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(InvalidOptionError, match=r"source\.starting_offsets"):
        load(_write(tmp_path, GOOD), {"source.starting_offsets": "{\"other\": {\"0\": 1}}"})


@pytest.mark.parametrize(("name", "location"), [
    ("checkpoint.location", "s3://my-bucket/orders"), ("table.path", "hdfs://nn/orders"),
    ("errors.table_path", "hdfs://nn/orders")])
def test_load_unsupported_location_refused_naming_setting(tmp_path: Path, name: str,
                                                          location: str) -> None:
    with pytest.raises(InvalidOptionError) as caught:
        load(_write(tmp_path, GOOD), {name: location})
    assert caught.value.key == name
    assert location in str(caught.value)
    assert "not supported" in str(caught.value)


def test_load_object_store_table_with_storage_section_keeps_options_secret(
        tmp_path: Path) -> None:
    text = GOOD + ('\n[table.storage]\naws_endpoint_url = "http://127.0.0.1:9000"\n'
                   'aws_secret_access_key = "very-secret-value"\n')
    config = load(_write(tmp_path, text), {"table.path": "s3://lake/trips/",
                                           "errors.table_path": "s3://lake/errors"})
    assert config["table.path"] == "s3://lake/trips"
    assert dict(config.storage_options) == {"aws_endpoint_url": "http://127.0.0.1:9000",
                                            "aws_secret_access_key": "very-secret-value"}
    shown = config.redacted()
    assert shown["table.storage.aws_endpoint_url"] == "http://127.0.0.1:9000"
    assert "very-secret-value" not in repr(shown) + repr(config)


@pytest.mark.parametrize("name", ["table.path", "checkpoint.location", "errors.table_path"])
def test_load_file_uri_location_becomes_local_path(tmp_path: Path, name: str) -> None:
    config = load(_write(tmp_path, GOOD), {name: "file:///data/my%20orders"})
    assert config[name] == "/data/my orders"


def test_invalid_toml_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidOptionError, match="not valid TOML"):
        load(_write(tmp_path, "[source\n"))


def test_docs_list_every_setting() -> None:
    doc = (ROOT / "docs" / "ingest.md").read_text()
    assert describe() in doc


def test_unquoted_dotted_passthrough_keys_name_the_same_option(tmp_path: Path) -> None:
    text = GOOD + '[spark.conf]\nspark.sql.shuffle.partitions = "2"\n'
    text = text.replace('"hoodie.logfile.data.block.format" = "parquet"',
                        'hoodie.client.heartbeat.interval_in_ms = "500"\n'
                        '"hoodie.logfile.data.block.format" = "parquet"')
    config = load(_write(tmp_path, text))
    assert config.table_options == {"hoodie.client.heartbeat.interval_in_ms": "500",
                                    "hoodie.logfile.data.block.format": "parquet"}
    assert config.spark_conf == {"spark.sql.shuffle.partitions": "2"}


def test_load_avro_formats_need_a_schema_file_and_confluent_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidOptionError, match=r"'decode\.schema_file': format avro needs"):
        load(_write(tmp_path, GOOD), {"decode.format": "avro"})
    with pytest.raises(InvalidOptionError, match=r"'decode\.format': avro-confluent needs"):
        load(_write(tmp_path, GOOD), {"decode.format": "avro-confluent",
                                      "decode.schema_file": "x.avsc"})


@pytest.mark.parametrize("ddl", ["id STRING, ts BIGINT, `a.b` INT",
                                 "id STRING, ts BIGINT, `my col` INT",
                                 "id STRING, ts BIGINT, meta STRUCT<`1st`: INT>"])
def test_decode_schema_with_a_name_avro_refuses_fails_at_job_start_naming_the_option(
        tmp_path: Path, ddl: str) -> None:
    """A declared field whose name is no Avro name would make a table no Hudi reader
    reads: the job refuses its decoder at start, naming ``decode.schema`` and the field
    (a Kafka record carrying such a field under a valid schema is only data: not this)."""
    from jobs.ingest_job import build_decoder

    config = load(_write(tmp_path, GOOD), {"decode.schema": ddl})
    with pytest.raises(InvalidOptionError,
                       match=r"decode\.schema.*'(a\.b|my col|meta\.1st)'.*\[A-Za-z_\]"):
        build_decoder(config)
    assert build_decoder(load(_write(tmp_path, GOOD))).schema.names == ["id", "ts"]

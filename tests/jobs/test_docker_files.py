"""What can be checked of the Docker demo without a Docker engine."""

from __future__ import annotations

import re
from pathlib import Path

from jobs.cli import build_parser
from jobs.job_config import load

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"


def test_job_file_parses() -> None:
    config = load(DOCKER / "job.toml")
    assert config["source.bootstrap_servers"] == "kafka:9092"
    assert config["table.path"].startswith("/data/")


def test_compose_commands_are_valid_tidelake_commands() -> None:
    import yaml
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    assert {"kafka", "producer", "job", "inspect"} <= set(services)
    parser = build_parser()
    for name in ("producer", "job", "inspect"):
        command = [str(c) for c in services[name]["command"]]
        if command[0] == "ingest":
            command[1] = str(DOCKER / "job.toml")
        parser.parse_args(command)  # exits (SystemExit) on an unknown flag
    assert services["kafka"]["image"].startswith("apache/kafka")


def test_dockerfile_copies_existing_paths_and_runs_tidelake() -> None:
    text = (DOCKER / "Dockerfile").read_text()
    for source in re.findall(r"^COPY (\S+(?: \S+)*?) \S+$", text, flags=re.M):
        for item in source.split():
            assert (ROOT / item).exists(), item
    assert 'ENTRYPOINT ["tidelake"]' in text
    assert "openjdk-17" in text

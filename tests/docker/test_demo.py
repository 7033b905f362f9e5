"""The docker-compose demo, run for real: build, up, produce, ingest, SIGKILL, restart, inspect.

``docker/compose.yaml`` with ``tests/docker/compose.test.yaml`` on top (a Tansu broker from the
tidelake image in place of Apache Kafka, which cannot be pulled here; a small, slow producer).
The test waits until the table holds every produced key with its last value (our reader and
hudi-rs, from the host), deletes applied and malformed records in the error table; SIGKILLs the
job's main process inside its container once, while a commit is in flight, and checks that the
container comes back by itself (restart policy) and that nothing is lost or duplicated; checks
the healthcheck, runs ``inspect``, and ``down -v`` leaves no container, network or volume.

The compose CLI is driven directly: testcontainers' compose support runs ``docker compose``
(v2) only, and Debian 12 packages Compose v1 (``docker-compose``); the harness uses whichever
answers. Select the test alone with ``pytest -m docker``. It needs a Docker engine: one that
answers, or root on Debian (the harness installs and starts one, and stops it afterwards;
tests/docker/engine.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine import Table
from engine.errors import TidelakeError
from jobs.sample_events import SampleEvents
from tests.conftest import hudi_rs_read
from tests.docker.engine import ROOT, DockerEngine, ensure_base_images, run

pytestmark = [pytest.mark.docker, pytest.mark.slow]

EVENTS = 3000
"""Events the producer sends, at :data:`RATE` per second: the job commits several
micro-batches (5 s trigger) while they come in, so one of them can be killed mid-commit."""
RATE = 100
SEED = 7  # `tidelake produce`'s default seed: the same events as in the container
TABLE, ERRORS = "trips", "trips_errors"  # under /data, as docker/job.toml says

KILL_IN_FLIGHT = r"""
import os, re, sys, time
timeline = '/data/trips/.hoodie/timeline'
deadline = time.monotonic() + float(sys.argv[1])

def job_pid():
    # the job's main process: the child of the container's init running `tidelake ingest`
    for entry in os.listdir('/proc'):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f'/proc/{entry}/stat') as f:
                ppid = int(f.read().rsplit(')', 1)[1].split()[1])
            with open(f'/proc/{entry}/cmdline', 'rb') as f:
                argv = f.read().split(b'\0')
        except (OSError, ValueError, IndexError):
            continue
        if ppid == 1 and b'ingest' in argv and any(a.endswith(b'tidelake') for a in argv):
            return int(entry)
    return None

while time.monotonic() < deadline:
    try:
        names = os.listdir(timeline)
    except FileNotFoundError:
        names = []
    done = {n.split('_')[0] for n in names if re.fullmatch(r'\d+_\d+\.deltacommit', n)}
    flying = [n.split('.')[0] for n in names if n.endswith('.deltacommit.inflight')]
    flying = [t for t in flying if t not in done]
    if done and flying:
        pid = job_pid()
        if pid is not None:
            print(json.dumps({'pid': pid, 'instant': flying[0], 'completed': len(done)}),
                  flush=True)
            os.kill(pid, 9)
            time.sleep(30)  # the container stops with its main process, and this with it
            sys.exit(0)
    time.sleep(0.005)
print('no deltacommit in flight before the deadline', file=sys.stderr)
sys.exit(3)
""".replace("import os, re, sys, time", "import json, os, re, sys, time")
"""Run inside the job container: once a deltacommit is inflight (after at least one completed),
SIGKILL the job's main process (``docker kill`` would count as a manual stop on Docker 20.10
and keep the restart policy from firing)."""


class Demo:
    """The compose project of one test run, and what can be asked of it."""

    def __init__(self, engine: DockerEngine) -> None:
        self.engine = engine
        self.project = f"tidelake-demo-test-{uuid.uuid4().hex[:8]}"
        self.env = {**os.environ, "TIDELAKE_DEMO_EVENTS": str(EVENTS),
                    "TIDELAKE_DEMO_RATE": str(RATE)}
        self._copy_dir: tempfile.TemporaryDirectory[str] | None = None

    def compose(self, *args: str, timeout: float, check: bool = True,
                tools: bool = False) -> subprocess.CompletedProcess[str]:
        """The compose command on the demo's files and this test's override (``tools``: with
        the ``tools`` profile, i.e. the inspect service)."""
        profile = ["--profile", "tools"] if tools else []
        return run([*self.engine.compose, "-p", self.project,
                    "-f", str(ROOT / "docker" / "compose.yaml"),
                    "-f", str(ROOT / "tests" / "docker" / "compose.test.yaml"),
                    *profile, *args], timeout=timeout, check=check, env=self.env)

    def container(self, service: str) -> str:
        """Id of the service's container (one replica)."""
        ids = self.compose("ps", "-a", "-q", service, timeout=60).stdout.split()
        assert len(ids) == 1, f"{service}: expected one container, found {ids}"
        return ids[0]

    def state(self, service: str) -> dict[str, Any]:
        """``docker inspect``'s ``State`` of the service's container, plus ``RestartCount``."""
        out = run(["docker", "inspect", "--format",
                   '{"State": {{json .State}}, "RestartCount": {{.RestartCount}}}',
                   self.container(service)], timeout=60).stdout
        info = json.loads(out)
        state: dict[str, Any] = info["State"]
        state["RestartCount"] = info["RestartCount"]
        return state

    def data_dir(self) -> Path:
        """The ``tables`` volume's folder as the host sees it: the volume's mount point when
        readable (root), else a fresh ``docker cp`` of /data out of the job's container."""
        volumes = run(["docker", "volume", "ls", "-q", "--filter",
                       f"label=com.docker.compose.project={self.project}", "--filter",
                       "label=com.docker.compose.volume=tables"], timeout=60).stdout.split()
        assert len(volumes) == 1, f"expected the project's tables volume, found {volumes}"
        mount = Path(run(["docker", "volume", "inspect", "--format", "{{.Mountpoint}}",
                          volumes[0]], timeout=60).stdout.strip())
        if os.access(mount, os.R_OK | os.X_OK):
            return mount
        if self._copy_dir is not None:
            self._copy_dir.cleanup()
        self._copy_dir = tempfile.TemporaryDirectory(prefix="tidelake-demo-data-")
        run(["docker", "cp", f"{self.container('job')}:/data", self._copy_dir.name],
            timeout=300)
        return Path(self._copy_dir.name) / "data"

    def logs(self) -> str:
        """Every service's log (tail) and the job's health log, for a failure report."""
        parts = [self.compose("logs", "--no-color", "--tail", "300", timeout=120,
                              check=False).stdout]
        with_health = run(["docker", "ps", "-a", "-q", "--filter",
                           f"label=com.docker.compose.project={self.project}"],
                          timeout=60, check=False).stdout.split()
        for cid in with_health:
            parts.append(run(["docker", "inspect", "--format",
                              "{{.Name}} {{.State.Status}} exit={{.State.ExitCode}} "
                              "restarts={{.RestartCount}} health={{json .State.Health}}", cid],
                             timeout=60, check=False).stdout)
        return "\n".join(parts)

    def leftovers(self) -> dict[str, list[str]]:
        """The project's containers, networks and volumes still present."""
        label = f"label=com.docker.compose.project={self.project}"
        found = {}
        for kind, cmd in (("containers", ["docker", "ps", "-a", "-q"]),
                          ("networks", ["docker", "network", "ls", "-q"]),
                          ("volumes", ["docker", "volume", "ls", "-q"])):
            found[kind] = run([*cmd, "--filter", label], timeout=60).stdout.split()
        return found

    def close(self) -> None:
        if self._copy_dir is not None:
            self._copy_dir.cleanup()


def wait_for(what: str, condition: Callable[[], Any], timeout: float, every: float = 2.0) -> Any:
    """Poll ``condition`` until it returns something truthy; raise naming ``what``."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = condition()
        except (TidelakeError, OSError, ValueError, KeyError) as exc:  # a table mid-write
            last_error, result = exc, None
        if result:
            return result
        time.sleep(every)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s"
                       + (f" (last error: {last_error!r})" if last_error else ""))


def _expected() -> SampleEvents:
    events = SampleEvents(EVENTS, seed=SEED)
    for _ in events:  # fills expected and malformed
        pass
    return events


def _rows_by_key(table: Any) -> dict[str, tuple[Any, ...]]:
    rows = table.select(["trip_id", "ts", "city", "fare", "rider"]).to_pylist()
    by_key = {r["trip_id"]: (r["ts"], r["city"], r["fare"], r["rider"]) for r in rows}
    assert len(by_key) == len(rows), "duplicate record keys"
    return by_key


def test_compose_demo_ingests_survives_sigkill_and_tears_down(engine: DockerEngine) -> None:
    events = _expected()
    want = {k: (r["ts"], r["city"], r["fare"], r["rider"]) for k, r in events.expected.items()}
    bad_keys = {key for key, _ in events.malformed}
    assert want and bad_keys and len(want) < EVENTS - len(bad_keys)  # updates and deletes too

    ensure_base_images()
    demo = Demo(engine)
    try:
        demo.compose("config", "-q", timeout=60, tools=True)  # the files as compose reads them
        demo.compose("build", "job", "inspect", timeout=1800, tools=True)
        demo.compose("up", "-d", timeout=300)

        # Once the job has committed and a later deltacommit is in flight: SIGKILL it.
        # The exec'd process goes down with the container (exit 137), after printing.
        kill = run(["docker", "exec", demo.container("job"), "python3", "-c", KILL_IN_FLIGHT,
                    "300"], timeout=330, check=False)
        assert kill.stdout.strip(), f"exit {kill.returncode}: {kill.stderr}"
        killed = json.loads(kill.stdout.splitlines()[0])
        assert killed["completed"] >= 1
        restarted = wait_for("the job container restarted by its restart policy",
                             lambda: (s := demo.state("job"))["RestartCount"] >= 1
                             and s["Running"] and s, timeout=120, every=1)
        assert restarted["RestartCount"] == 1

        producer = wait_for("the producer finished",
                            lambda: (s := demo.state("producer"))["Status"] == "exited" and s,
                            timeout=300)
        assert producer["ExitCode"] == 0, demo.compose("logs", "producer", timeout=60).stdout

        def caught_up() -> bool:
            data = demo.data_dir()
            ours = _rows_by_key(Table.open(str(data / TABLE)).read())
            errors = Table.open(str(data / ERRORS)).read(columns=["kafka_key"])
            return ours == want and len(errors) == len(bad_keys)

        wait_for("the table holds every produced key with its last value", caught_up,
                 timeout=600, every=3)
        data = demo.data_dir()
        assert _rows_by_key(Table.open(str(data / TABLE)).read()) == want
        assert _rows_by_key(hudi_rs_read(data / TABLE)) == want
        errors = Table.open(str(data / ERRORS)).read(columns=["kafka_key", "reason"])
        assert {k.decode() for k in errors.column("kafka_key").to_pylist()} == {
            k.decode() for k in bad_keys}
        assert demo.state("job")["RestartCount"] == 1  # no further crash after the kill

        health = wait_for("the job's healthcheck says healthy",
                          lambda: (h := demo.state("job").get("Health") or {}).get("Status")
                          == "healthy" and h, timeout=120, every=2)
        assert any("healthy: " in entry["Output"] for entry in health["Log"])

        shown = demo.compose("run", "--rm", "inspect", timeout=300, tools=True).stdout
        assert f"rows: {len(want):,} (latest snapshot)" in shown, shown
        assert f"{len(bad_keys):,} records the job could not write" in shown, shown
        assert "readers agree: yes" in shown, shown
        assert "deltacommit" in shown and "last checkpoint: offsets trips," in shown, shown
    except BaseException:
        print(demo.logs())
        raise
    finally:
        demo.close()
        demo.compose("down", "-v", "--remove-orphans", "--timeout", "30", timeout=300,
                     check=False)
    assert demo.leftovers() == {"containers": [], "networks": [], "volumes": []}

"""The docker-compose demo, run for real: build, up, produce, ingest, SIGKILL, restart, inspect.

``docker/compose.yaml`` with ``tests/docker/compose.test.yaml`` on top: a Tansu broker from the
tidelake image in place of Apache Kafka, which cannot be pulled here, and faster healthchecks;
the producer sends the compose file's own count at its own rate (read from docker/compose.yaml:
200,000 events at 2,000/s), then 60,000 more at the same rate once the job has committed, as in
the run that showed issue 22 item 11. While those are being sent and a deltacommit of the job
is in flight (after at least one completed), the test SIGKILLs the job container and checks
that Docker restarts it by its restart policy, once. (At the compose rate the producer's 100 s
are over before the job's first commit, about 105 s after ``up`` here: the second wave is what
a kill can land in.) Then, exactly once: the table (our reader and hudi-rs, from the host)
holds every produced key with its last value, deletes applied, the malformed records in the
error table, and neither table's timeline holds a pending instant; the job's healthcheck says
healthy; ``inspect`` agrees; ``down -v`` leaves no container, network or volume. It prints what
it measured (kill, restart, catch-up).

How the container is killed: SIGKILL to its init process from the host (the kernel then kills
everything in the container), as an OOM kill or a crash would. ``docker kill`` is not used:
Docker 20.10 (Debian 12's docker.io) marks a killed container as manually stopped and does not
restart it (seen here: exit 137, RestartCount 0). Without the right to signal the host process
(not root), ``kill -9 -1`` as root inside the container does the same from within.

The compose CLI is driven directly: testcontainers' compose support runs ``docker compose``
(v2) only, and Debian 12 packages Compose v1 (``docker-compose``); the harness uses whichever
answers. Select the test alone with ``pytest -m docker`` (it takes about 10 minutes). It needs
a Docker engine: one that answers, or root on Debian (the harness installs and starts one, and
stops it afterwards; tests/docker/engine.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from engine import Table
from engine.errors import TidelakeError
from jobs.sample_events import SampleEvents
from tests.docker.engine import ROOT, DockerEngine, ensure_base_images, run
from tests.helpers import hudi_rs_read, rows_by_key

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TABLE, ERRORS = "trips", "trips_errors"  # under /data, as docker/job.toml says
TRIP_VALUES = ("ts", "city", "fare", "rider")
"""What each trip_id holds, as the test compares it."""
COMPOSE_FILE = ROOT / "docker" / "compose.yaml"
SECOND_WAVE, SECOND_WAVE_SEED = 60_000, 8
"""After the compose file's production, 60,000 more events (other keys: another seed) at the
same rate, as the run of issue 22 item 11 did: the kill lands while they are being sent."""


@dataclass(frozen=True)
class Production:
    """What the compose file's producer sends: ``tidelake produce`` with these flags."""

    count: int
    rate: float
    seed: int


def compose_production() -> Production:
    """The producer's ``--count``, ``--rate`` and ``--seed`` in docker/compose.yaml (the seed
    defaults to `tidelake produce`'s, 7): the events the test expects, as users produce them."""
    import yaml

    command = yaml.safe_load(COMPOSE_FILE.read_text())["services"]["producer"]["command"]
    flags = dict(zip(command[1::2], command[2::2], strict=False))
    return Production(int(flags["--count"]), float(flags["--rate"]),
                      int(flags.get("--seed", 7)))


WATCH_IN_FLIGHT = r"""
import json, os, re, sys, time
timeline = '/data/trips/.hoodie/timeline'
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline:
    try:
        names = os.listdir(timeline)
    except FileNotFoundError:
        names = []
    done = {n.split('_')[0] for n in names if re.fullmatch(r'\d+_\d+\.deltacommit', n)}
    flying = [n.split('.')[0] for n in names if n.endswith('.deltacommit.inflight')]
    flying = [t for t in flying if t not in done]
    if done and flying:
        print(json.dumps({'instant': flying[0], 'completed': len(done)}), flush=True)
        sys.exit(0)
    time.sleep(0.005)
print('no deltacommit in flight before the deadline', file=sys.stderr)
sys.exit(3)
"""
"""Run inside the job container: returns (printing the instant) as soon as a deltacommit is
inflight after at least one completed."""


class Demo:
    """The compose project of one test run, and what can be asked of it."""

    def __init__(self, engine: DockerEngine, production: Production) -> None:
        self.engine = engine
        self.project = f"tidelake-demo-test-{uuid.uuid4().hex[:8]}"
        self.env = {**os.environ, "TIDELAKE_DEMO_EVENTS": str(production.count),
                    "TIDELAKE_DEMO_RATE": f"{production.rate:g}"}
        self._copy_dir: tempfile.TemporaryDirectory[str] | None = None

    def compose(self, *args: str, timeout: float, check: bool = True,
                tools: bool = False) -> subprocess.CompletedProcess[str]:
        """The compose command on the demo's files and this test's override (``tools``: with
        the ``tools`` profile, i.e. the inspect service)."""
        profile = ["--profile", "tools"] if tools else []
        return run([*self.engine.compose, "-p", self.project,
                    "-f", str(COMPOSE_FILE),
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

    def sigkill(self, service: str) -> str:
        """SIGKILL the service's container as a crash would (see the module docstring): its
        init process from the host, else every process from within. Returns which."""
        cid = self.container(service)
        pid = int(run(["docker", "inspect", "--format", "{{.State.Pid}}", cid],
                      timeout=60).stdout)
        try:
            os.kill(pid, signal.SIGKILL)
            return f"host pid {pid} (the container's init)"
        except PermissionError:
            run(["docker", "exec", "-u", "0", cid, "kill", "-KILL", "-1"], timeout=60,
                check=False)
            return "kill -KILL -1 as root inside the container"

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


def _expected(count: int, seed: int) -> SampleEvents:
    events = SampleEvents(count, seed=seed)
    for _ in events:  # fills expected and malformed
        pass
    return events


def _pending(data: Path) -> dict[str, list[str]]:
    """Instants not completed on the data and error tables' timelines."""
    return {name: [f"{e.instant_time} {e.action} {e.state}"
                   for e in Table.open(str(data / name)).timeline() if e.state != "completed"]
            for name in (TABLE, ERRORS)}


def _container_state(name: str) -> dict[str, Any]:
    state: dict[str, Any] = json.loads(run(["docker", "inspect", "--format", "{{json .State}}",
                                            name], timeout=60).stdout)
    return state


def _completed_deltacommits(data: Path) -> set[str]:
    return {e.instant_time for e in Table.open(str(data / TABLE)).timeline()
            if e.action == "deltacommit" and e.state == "completed"}


def test_compose_demo_at_its_own_rate_is_exactly_once_after_sigkill(
        engine: DockerEngine) -> None:
    production = compose_production()
    waves = [_expected(production.count, production.seed),
             _expected(SECOND_WAVE, SECOND_WAVE_SEED)]
    want = {k: (r["ts"], r["city"], r["fare"], r["rider"])
            for events in waves for k, r in events.expected.items()}
    bad_keys = {key for events in waves for key, _ in events.malformed}
    bad_count = sum(len(events.malformed) for events in waves)
    assert len(want) == sum(len(events.expected) for events in waves)  # no key in both
    assert want and bad_keys and len(want) < production.count + SECOND_WAVE - bad_count

    ensure_base_images()
    demo = Demo(engine, production)
    figures: dict[str, Any] = {"events": production.count + SECOND_WAVE,
                               "rate": production.rate}
    second: str | None = None
    try:
        demo.compose("config", "-q", timeout=60, tools=True)  # the files as compose reads them
        demo.compose("build", "job", "inspect", timeout=1800, tools=True)
        up = time.monotonic()
        demo.compose("up", "-d", timeout=300)

        producer = wait_for("the producer finished",
                            lambda: (s := demo.state("producer"))["Status"] == "exited" and s,
                            timeout=900)
        assert producer["ExitCode"] == 0, demo.compose("logs", "producer", timeout=60).stdout
        figures["first_wave_sent_in_s"] = round(time.monotonic() - up, 1)
        wait_for("a first deltacommit", lambda: _completed_deltacommits(demo.data_dir()),
                 timeout=600, every=1)
        figures["first_commit_after_s"] = round(time.monotonic() - up, 1)

        # Production resumes, at the same rate; while it runs, once a deltacommit is in
        # flight (after at least one completed): SIGKILL the job's container.
        second = demo.compose(
            "run", "-d", "--no-deps", "producer", "produce", "--bootstrap-servers",
            "kafka:9092", "--topic", "trips", "--count", str(SECOND_WAVE), "--rate",
            f"{production.rate:g}", "--seed", str(SECOND_WAVE_SEED), timeout=120,
        ).stdout.split()[-1]
        seen = run(["docker", "exec", demo.container("job"), "python3", "-c", WATCH_IN_FLIGHT,
                    "600"], timeout=630, check=False)
        assert seen.returncode == 0 and seen.stdout.strip(), \
            f"exit {seen.returncode}: {seen.stderr}"
        figures["killed_by"] = demo.sigkill("job")
        killed_at = time.monotonic()
        killed = json.loads(seen.stdout.splitlines()[0])
        figures.update(kill_after_s=round(killed_at - up, 1), in_flight=killed["instant"],
                       completed_before_kill=killed["completed"])
        assert _container_state(second)["Running"], "the second wave ended before the kill"
        before = _completed_deltacommits(demo.data_dir())

        restarted = wait_for("the job container restarted by its restart policy",
                             lambda: (s := demo.state("job"))["RestartCount"] >= 1
                             and s["Running"] and s, timeout=120, every=0.2)
        figures["restarted_after_s"] = round(time.monotonic() - killed_at, 1)
        assert restarted["RestartCount"] == 1
        wait_for("a deltacommit of the restarted job",
                 lambda: _completed_deltacommits(demo.data_dir()) - before - {
                     killed["instant"]}, timeout=600, every=1)
        figures["first_commit_after_kill_s"] = round(time.monotonic() - killed_at, 1)
        wave = wait_for("the second wave finished",
                        lambda: (s := _container_state(second))["Status"] == "exited" and s,
                        timeout=300)
        assert wave["ExitCode"] == 0

        def caught_up() -> bool:
            data = demo.data_dir()
            ours = rows_by_key(Table.open(str(data / TABLE)).read(), "trip_id", TRIP_VALUES,
                               once=True)
            errors = Table.open(str(data / ERRORS)).read(columns=["kafka_key"])
            return ours == want and len(errors) == bad_count

        wait_for("the table holds every produced key with its last value", caught_up,
                 timeout=900, every=3)
        figures["caught_up_after_s"] = round(time.monotonic() - up, 1)
        data = demo.data_dir()
        for read in (Table.open(str(data / TABLE)).read(), hudi_rs_read(data / TABLE)):
            assert rows_by_key(read, "trip_id", TRIP_VALUES, once=True) == want
        errors = Table.open(str(data / ERRORS)).read(columns=["kafka_key", "reason"])
        assert {k.decode() for k in errors.column("kafka_key").to_pylist()} == {
            k.decode() for k in bad_keys}
        figures["killed_instant_completed"] = killed["instant"] in _completed_deltacommits(data)

        # Nothing the killed run left is pending, in either table (issue 22 item 10).
        pending: list[dict[str, list[str]]] = []

        def settled() -> bool:
            pending.append(_pending(demo.data_dir()))
            return not any(pending[-1].values())

        wait_for("nothing pending on the data and error tables' timelines", settled,
                 timeout=300, every=3)
        figures["nothing_pending_after_s"] = round(time.monotonic() - up, 1)
        assert demo.state("job")["RestartCount"] == 1  # no further crash after the kill

        health = wait_for("the job's healthcheck says healthy",
                          lambda: (h := demo.state("job").get("Health") or {}).get("Status")
                          == "healthy" and h, timeout=180, every=2)
        assert any("healthy: " in entry["Output"] for entry in health["Log"])

        shown = demo.compose("run", "--rm", "inspect", timeout=300, tools=True).stdout
        assert f"rows: {len(want):,} (latest snapshot)" in shown, shown
        assert f"{bad_count:,} records the job could not write" in shown, shown
        assert "readers agree: yes" in shown, shown
        assert "deltacommit" in shown and "last checkpoint: offsets trips," in shown, shown
    except BaseException:
        print(f"figures so far: {figures}")
        if "pending" in locals() and pending:
            print(f"last pending instants seen: {pending[-1]}")
        print(demo.logs())
        raise
    finally:
        demo.close()
        if second is not None:  # a one-off container (and its /data volume): down leaves them
            run(["docker", "rm", "-f", "-v", second], timeout=120, check=False)
        demo.compose("down", "-v", "--remove-orphans", "--timeout", "30", timeout=300,
                     check=False)
    print(f"demo figures: {figures}")
    assert demo.leftovers() == {"containers": [], "networks": [], "volumes": []}

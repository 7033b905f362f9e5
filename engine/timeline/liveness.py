"""Whether the process that wrote a lock or heartbeat record provably ended.

A record names the machine's boot, the writer's pid namespace, its pid and its start time
(:func:`this_process`). :func:`process_ended` is true only when all of those are this
machine's boot and this process's namespace, and that pid is free, a zombie, or now a
process started later: the writer was killed. Anything unknown — another machine, another
container, no ``/proc``, another user's process whose start time cannot be read — counts
as alive, and then only the record's expiry applies. ``kill(pid, 0)`` decides whether the
pid exists, so /proc ``hidepid`` cannot fake a death.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _process_state(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks since boot) of process ``pid`` from
    ``/proc/<pid>/stat`` (fields 3 and 22); None when it cannot be read."""
    stat = _read_text(f"/proc/{pid}/stat")
    fields = stat[stat.rfind(")") + 2:].split() if ")" in stat else []
    return (fields[0], fields[19]) if len(fields) > 19 else None


def _where() -> dict[str, str]:
    """This machine's boot and this process's pid namespace (empty off Linux)."""
    return {"boot_id": _read_text("/proc/sys/kernel/random/boot_id"),
            "pid_ns": _pid_namespace()}


def this_process() -> dict[str, object]:
    """What identifies this process for :func:`process_ended` (empty values off Linux)."""
    state = _process_state(os.getpid())
    return {"pid": os.getpid(), **_where(), "started": state[1] if state else ""}


def process_ended(info: Mapping[str, object]) -> bool:
    """True only when the process a record names provably ended (see the module doc)."""
    here = _where()
    pid, started = info.get("pid"), info.get("started")
    if not (here["boot_id"] and here["pid_ns"] and isinstance(pid, int) and pid > 0
            and started and all(info.get(k) == v for k, v in here.items())):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # exists, another user's
    except OSError:
        return False
    state = _process_state(pid)
    return state is not None and (state[0] in ("Z", "X") or state[1] != started)

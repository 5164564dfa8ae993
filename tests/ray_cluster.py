"""A real Ray cluster on this machine for the Ray tests and bench/ray_overhead.py: a head node plus worker nodes
from `ray start --address`, small CPU and memory limits, every port picked free here.

Each `ray start` runs in a session of its own (start_new_session), and the daemons it leaves behind (gcs_server,
raylet, agents, the raylet's worker processes) stay in that session: a node is stopped, or killed mid-job, by
SIGKILL to the processes of its session id. `ray stop` is not used: it stops every Ray process on the machine,
whatever their --temp-dir, so it would stop other sessions' clusters too.
Ray advertises the machine's address even when told 127.0.0.1 (services.resolve_ip_for_localhost; on Linux a
multi-node cluster cannot stay on loopback), but everything here connects to 127.0.0.1:<port>.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from s3_servers import free_port

ROOT = Path(__file__).resolve().parent.parent
MEMORY = 200 * 1024 * 1024       # --memory of each node (what Ray schedules against)
OBJECT_STORE = 100 * 1024 * 1024  # --object-store-memory of each node (Ray's minimum is 75 MB)


def _ray_cli() -> list[str]:
    beside_python = Path(sys.executable).parent / "ray"
    return [str(beside_python)] if beside_python.is_file() else [sys.executable, "-m", "ray.scripts.scripts"]


def session_processes(session: int) -> list[int]:
    """The pids in a session (Linux /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == session:
                    found.append(int(entry))
            except OSError:  # gone meanwhile
                pass
    return found


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class LocalCluster:
    """`ray start --head` on 127.0.0.1 with a private --temp-dir, and nodes added to it; stop() kills all of it."""

    def __init__(self, num_cpus: int = 1):
        self.temp_dir = tempfile.mkdtemp(prefix="brray-", dir="/tmp")  # short: Ray's socket paths must fit
        self.ports: set[int] = set()
        self.port = self.free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.sessions: list[int] = []
        # A dead node is noticed in ~3 s instead of ~30 s (read by the GCS).
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                                                if p),
                        RAY_USAGE_STATS_ENABLED="0", RAY_health_check_period_ms="1000",
                        RAY_health_check_timeout_ms="1000", RAY_health_check_failure_threshold="3")
        self.head = self._start(["--head", f"--port={self.port}", f"--temp-dir={self.temp_dir}",
                                 "--include-dashboard=false", f"--ray-client-server-port={self.free_port()}",
                                 f"--dashboard-port={self.free_port()}"], num_cpus)

    def free_port(self) -> int:
        """A port free now and not handed to another component of this cluster yet: the OS gives a port it just
        freed again, and `ray start` refused a head whose client server and object manager got the same one."""
        while True:
            port = free_port()
            if port not in self.ports:
                self.ports.add(port)
                return port

    def add_node(self, num_cpus: int = 1, resources: dict | None = None) -> int:
        """A worker node; returns its session id (for kill_node)."""
        extra = [f"--address={self.address}"]
        if resources:
            extra.append(f"--resources={json.dumps(resources)}")
        return self._start(extra, num_cpus)

    def _start(self, extra: list[str], num_cpus: int) -> int:
        command = [*_ray_cli(), "start", *extra, "--node-ip-address=127.0.0.1", f"--num-cpus={num_cpus}",
                   f"--memory={MEMORY}", f"--object-store-memory={OBJECT_STORE}", "--disable-usage-stats",
                   f"--node-manager-port={self.free_port()}", f"--dashboard-agent-listen-port={self.free_port()}",
                   f"--object-manager-port={self.free_port()}"]
        starter = subprocess.Popen(command, env=self.env, start_new_session=True, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        self.sessions.append(starter.pid)  # its session id: the daemons it starts keep it
        output, _ = starter.communicate(timeout=180)
        if starter.returncode != 0:
            self.stop()
            raise RuntimeError(f"`{' '.join(command)}` failed:\n{output[-3000:]}")
        return starter.pid

    def workers_running(self, session: int, task_prefix: str = "ray::emulator") -> list[int]:
        """The node's worker processes executing a task now (Ray renames a busy worker ray::<task name>)."""
        return [pid for pid in session_processes(session) if command_line(pid).startswith(task_prefix)]

    def kill_node(self, session: int) -> None:
        """SIGKILL every process of that node, as when its machine dies."""
        for pid in session_processes(session):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def keep_first_nodes(self, count: int, timeout: float = 60) -> None:
        """Back to the first `count` nodes started (the head first): the nodes added after them are killed, if a
        test left one alive (it failed before its kill), and the GCS is waited on until it sees `count` live."""
        for session in self.sessions[count:]:
            self.kill_node(session)
        self.wait_for_nodes(count, timeout)

    def wait_for_nodes(self, count: int, timeout: float = 60) -> None:
        """Until the cluster's live nodes are `count` (after a start or a kill), as the GCS sees them."""
        import ray
        deadline = time.monotonic() + timeout
        while True:
            alive = sum(1 for node in ray.nodes() if node["Alive"])
            if alive == count:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{alive} live Ray node(s), not {count}, after {timeout} s")
            time.sleep(0.5)

    def stop(self) -> None:
        for session in self.sessions:
            self.kill_node(session)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

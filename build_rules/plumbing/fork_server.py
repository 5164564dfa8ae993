"""Python processes forked from a server that has imported numpy and onnx once (and torch, for the stages that use
it), instead of fresh interpreters that each import them again.

Why: a build starts a Python process per stage, per compile (ort_qnn) and per emulator worker: a tiny net's build
starts ~55 of them, and each fresh interpreter spent ~0.25 s starting and importing before its own work (most of a
small graph's compile or check; ~1.2 s more with torch). The server (a child of the doit process, started by the
first stage that asks) imports them, starts no thread and loads no QNN library, then forks a child for each request.
The child is then what `python -c code args` or `python -m module args` gives: its own pid, the caller's
environment, working folder, stdio and extra file descriptors, the exit code or signal of the code it ran, and no QNN
state (no session was ever opened in the server: ort_qnn's compile relies on that for byte-stable binaries).

Not the same as a fresh interpreter, by design of fork: what the interpreter reads at start (PYTHONPATH, a
sitecustomize, LD_LIBRARY_PATH ...) is the server's. So a server serves only callers whose environment equals the one
it was started with (but for VOLATILE and the tool's own BUILD_RULES_ settings): a caller with another one gets a
fresh interpreter (subprocess.Popen), and the runner starts a server for its new environment. The child's parent is
the server, not the caller (a worker that must die with its caller watches its pipe, not its parent: emulator_pool).
It serves its own user only. Linux only; BUILD_RULES_FORK_SERVER=0 gives fresh interpreters everywhere.

Standard library only (the server imports this module before anything else).
"""
from __future__ import annotations

import gc
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid

# What nearly every stage, compile and emulator worker imports. Not onnxruntime: its import starts a thread, and a
# child forked after it hangs in onnxruntime's exit handlers (a lock that thread held). torch starts none: the runner
# asks for a server that has imported it too for the stages that use it (stage_table.imports_torch).
PRELOAD = ("numpy", "onnx")
ADDRESS = "BUILD_RULES_FORK_SERVER_ADDRESS"  # set in a forked child's environment: its own children ask there too
SWITCH = "BUILD_RULES_FORK_SERVER"  # "0": fresh interpreters only
_KEY = "BUILD_RULES_FORK_SERVER_KEY"  # beside it: which environment that server serves
VOLATILE = ("PYTEST_CURRENT_TEST", ADDRESS, _KEY)  # change between calls, read by nobody at interpreter start
# The tool's own settings: its modules read them when called, none at import (a server has imported none of them, but
# for what a sitecustomize imports), so a child reads the caller's values, which it is given.
OWN = "BUILD_RULES_"
FORKED = False  # True in a child this server forked


def env_key(env) -> str:
    """What a server's environment must equal for it to serve a caller: all of it but VOLATILE and the tool's own
    settings (OWN), which nothing reads at interpreter start. A child gets the caller's values of those: a build that
    changes one (the tests do, between runs: BUILD_RULES_CACHE, BUILD_RULES_EMULATOR_WORKERS ...) keeps its server
    and saves a restart (~2 s with torch; 131 starts in a run of the suite, 43 of them for such a change alone)."""
    return json.dumps(sorted((k, v) for k, v in env.items() if k not in VOLATILE and not k.startswith(OWN)))


def enabled() -> bool:
    """Linux only: the server listens on an abstract socket (no file) and checks who connects (SO_PEERCRED)."""
    return sys.platform.startswith("linux") and hasattr(socket, "send_fds") and os.environ.get(SWITCH, "1") != "0"


# --------------------------------------------------------------------------------------------------------------
# caller side

class _Server:
    def __init__(self, env: dict, preload: tuple):
        self.key = env_key(env)
        self.address = f"\0build_rules-fork-server-{os.getpid()}-{uuid.uuid4().hex}"  # abstract: no file to clean
        self.owner = os.getpid()
        death_r, self.death_w = os.pipe()  # the server ends when this end closes (this process is gone)
        code = (f"from build_rules.plumbing.fork_server import _serve; "
                f"_serve({self.address[1:]!r}, {death_r}, {tuple(preload)!r})")
        self.process = subprocess.Popen([sys.executable, "-c", code], env=env, pass_fds=(death_r,),
                                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, cwd="/")
        os.close(death_r)
        ready = _READY
        for line in self.process.stdout:  # after its imports (a sitecustomize or an import may print before it)
            if line == _READY:
                break
        else:
            ready = b""
        self.process.stdout.close()
        if ready != _READY:
            self.stop()
            raise OSError(f"the fork server did not start (exit code {self.process.wait()})")

    def stop(self) -> None:
        """It ends once the children it forked have ended (it reports their exit)."""
        if self.death_w is not None:
            os.close(self.death_w)
            self.death_w = None


_READY = b"ready from the fork server\n"
_servers: dict[tuple, _Server] = {}  # by what they import beyond PRELOAD: one per kind, for the latest environment
_lock = threading.Lock()


def _server_for(env: dict, preload: tuple) -> _Server | None:
    """The running server for this environment and preload, started (and an older one stopped) if need be."""
    with _lock:
        server = _servers.pop(preload, None)
        if server is not None and server.owner == os.getpid() and server.key == env_key(env) \
                and server.process.poll() is None:
            _servers[preload] = server
            return server
        if server is not None and server.owner == os.getpid():
            server.stop()
        try:
            _servers[preload] = _Server(env, preload)
        except OSError:
            return None
        return _servers[preload]


def _address_for(env: dict, start: bool, preload: tuple) -> str | None:
    if not enabled():
        return None
    if start:
        server = _server_for(env, tuple(preload))
        return server.address if server else None
    inherited = os.environ.get(ADDRESS)  # a forked child asks its own server, if the environment is still the same
    if inherited and os.environ.get(_KEY) == _digest(env_key(env)):
        return "\0" + inherited
    return None


def _digest(key: str) -> str:
    import hashlib
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def python_process(args: list[str], *, env: dict | None = None, cwd=None, stdin=None, stdout=None, stderr=None,
                   pass_fds: tuple = (), start_server: bool = False, preload: tuple = ()):
    """subprocess.Popen([sys.executable, *args], ...) where args start with "-c" or "-m"; forked from a server when
    one serves this environment (start_server: the caller may start one, that also imports `preload`; the runner
    does). stdin/stdout/stderr as Popen takes them: None, subprocess.PIPE, DEVNULL, STDOUT (stderr), a file or a
    descriptor."""
    env = dict(os.environ if env is None else env)
    address = _address_for(env, start_server, preload)
    if address is not None:
        try:
            return _Forked(address, args, env, cwd, stdin, stdout, stderr, pass_fds)
        except OSError:
            pass  # the server is gone (its caller ended, or it was killed): a fresh interpreter does the same work
    return subprocess.Popen([sys.executable, *args], env=env, cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr,
                            pass_fds=pass_fds)


def run(args: list[str], *, input: str | None = None, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    """subprocess.run([sys.executable, *args], input=input, capture_output=True, text=True), via python_process."""
    proc = python_process(args, env=env, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)
    out, err = proc.communicate(None if input is None else input.encode())
    return subprocess.CompletedProcess([sys.executable, *args], proc.returncode, out.decode(errors="replace"),
                                       err.decode(errors="replace"))


def _fd_for(spec, which: int, pipes: list, closers: list):
    """(descriptor to send, our end as a file or None) for a Popen-style stdio spec."""
    if spec is None:
        return which, None
    if spec == subprocess.DEVNULL:
        fd = os.open(os.devnull, os.O_RDWR)
        closers.append(fd)
        return fd, None
    if spec == subprocess.PIPE:
        r, w = os.pipe()
        ours, theirs = (w, r) if which == 0 else (r, w)
        closers.append(theirs)
        pipes.append(ours)
        return theirs, os.fdopen(ours, "wb" if which == 0 else "rb")
    return (spec if isinstance(spec, int) else spec.fileno()), None


class _Forked:
    """The Popen-like handle of a forked child: pid, returncode, stdin/stdout/stderr, poll, wait, kill, terminate,
    send_signal, communicate."""

    def __init__(self, address, args, env, cwd, stdin, stdout, stderr, pass_fds):
        self.args, self.returncode = [sys.executable, *args], None
        closers, pipes = [], []
        try:
            fd_in, self.stdin = _fd_for(stdin, 0, pipes, closers)
            fd_out, self.stdout = _fd_for(stdout, 1, pipes, closers)
            if stderr == subprocess.STDOUT:
                fd_err, self.stderr = fd_out, None
            else:
                fd_err, self.stderr = _fd_for(stderr, 2, pipes, closers)
            child_env = dict(env, **{ADDRESS: address[1:], _KEY: _digest(env_key(env))})
            request = json.dumps({"args": list(args), "env": child_env, "cwd": os.fspath(cwd or os.getcwd()),
                                  "fds": [0, 1, 2, *pass_fds]}).encode()
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._sock.connect(address)
            message = struct.pack("!I", len(request)) + request
            socket.send_fds(self._sock, [message], [fd_in, fd_out, fd_err, *pass_fds])
            self._buffer = b""
            first = self._line(None)
            if not first.startswith(b"pid "):
                raise OSError(f"the fork server refused {args[:2]}: {first.decode(errors='replace').strip()}")
            self.pid = int(first.split()[1])
        except BaseException:
            for f in (self.stdin, self.stdout, getattr(self, "stderr", None)):
                if f is not None:
                    f.close()
            if hasattr(self, "_sock"):
                self._sock.close()
            raise
        finally:
            for fd in closers:
                os.close(fd)

    def _line(self, timeout: float | None) -> bytes | None:
        """The server's next line (b"" when it closed the connection), or None if none came within timeout."""
        import select
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if left is not None and not select.select([self._sock], [], [], left)[0]:
                return None
            chunk = self._sock.recv(4096)
            if not chunk:
                line, self._buffer = self._buffer, b""
                return line
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line + b"\n"

    def poll(self):
        if self.returncode is None:
            self._exit(self._line(0))
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            line = self._line(timeout)
            if line is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._exit(line)
        return self.returncode

    def _exit(self, line: bytes | None) -> None:
        if line is None:
            return
        if line.startswith(b"exit "):
            self.returncode = int(line.split()[1])
        else:  # the server died before the child: wait for the child by its pid (it is not ours to reap)
            while alive(self.pid):
                time.sleep(0.05)
            self.returncode = 255
        self._sock.close()

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def communicate(self, input=None, timeout=None):
        """As Popen.communicate: bytes in, (stdout, stderr) bytes out."""
        results = {}

        def read(name, f):
            with f:
                results[name] = f.read()
        readers = [threading.Thread(target=read, args=(n, f), daemon=True)
                   for n, f in (("out", self.stdout), ("err", self.stderr)) if f is not None]
        for t in readers:
            t.start()
        if self.stdin is not None:
            try:
                with self.stdin:
                    if input:
                        self.stdin.write(input)
            except BrokenPipeError:
                pass
        for t in readers:
            t.join()
        self.wait(timeout)
        return results.get("out"), results.get("err")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for f in (self.stdin, self.stdout, self.stderr):
            if f is not None:
                f.close()
        self.wait()


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie has ended; another user's process counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return True


# --------------------------------------------------------------------------------------------------------------
# server side

def _serve(address: str, death_fd: int, preload: tuple = ()) -> None:
    """The server's body (python -c): import PRELOAD and `preload`, say ready, fork a child per request until the
    caller is gone and the children have ended. In a child, returns into the child's code instead (the -c bootstrap
    ends with the code's own exit, as `python -c` would)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the process group: the caller decides
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # (it ends with its caller, below; SIGKILL still ends it)
    for module in (*PRELOAD, *preload):
        try:
            __import__(module)
        except Exception:  # not installed (or hidden): the child imports, or fails, as a fresh interpreter would
            pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + address)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that SIGCHLD writes to the wakeup descriptor
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "request")
    selector.register(wake_r, selectors.EVENT_READ, "child")
    selector.register(death_fd, selectors.EVENT_READ, "caller")
    children: dict[int, socket.socket] = {}
    caller_alive = True
    sys.stdout.write(_READY.decode())
    sys.stdout.flush()
    while caller_alive or children:
        for key, _ in selector.select():
            if key.data == "request":
                conn, _ = listener.accept()
                if _peer_uid(conn) != os.getuid():  # an abstract socket has no file mode: anyone may connect
                    conn.close()
                    continue
                job = _fork_child(conn, children)
                if job is not None:  # this is the child
                    for fd in (wake_r, wake_w, death_fd):
                        os.close(fd)
                    selector.close()
                    listener.close()
                    for other in children.values():
                        other.close()
                    return _run_child(job)
            elif key.data == "child":
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
            else:  # the caller closed its end: it has ended, or moved to another server
                selector.unregister(death_fd)
                selector.unregister(listener)
                listener.close()
                caller_alive = False
        _reap(children)
    os._exit(0)


def _peer_uid(conn: socket.socket) -> int:
    _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return uid


def _reap(children: dict) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            _say(conn, f"exit {os.waitstatus_to_exitcode(status)}")
            conn.close()


def _fork_child(conn: socket.socket, children: dict):
    """Read one request and fork its child: None in the server, the request in the child."""
    fds = []
    try:
        conn.settimeout(30)  # a caller sends its request at once: one that does not must not stop the server
        head, fds, _, _ = socket.recv_fds(conn, 4 + 65536, 64)
        size = struct.unpack("!I", head[:4])[0]
        data = head[4:]
        while len(data) < size:
            more = conn.recv(size - len(data))
            if not more:
                raise ConnectionError("request cut short")
            data += more
        job = json.loads(data)
        job["received"] = fds
        conn.settimeout(None)
    except (OSError, ValueError, struct.error) as e:
        for fd in fds:
            os.close(fd)
        _say(conn, f"error {e}")
        conn.close()
        return None
    # The server's objects move to the collector's permanent generation first: a child's collections (one runs at
    # its exit) then never walk them, which would copy every page they live on (gc.freeze's documented use).
    gc.freeze()
    pid = os.fork()
    if pid == 0:
        conn.close()
        return job
    for fd in fds:
        os.close(fd)
    _say(conn, f"pid {pid}")
    children[pid] = conn
    return None


def _say(conn: socket.socket, line: str) -> None:
    """One line to a caller, who may be gone (killed): then nobody listens."""
    try:
        conn.sendall(f"{line}\n".encode())
    except OSError:
        pass


def _run_child(job: dict):
    """In the forked child: become what `python <args>` would be, then run the code."""
    global FORKED
    FORKED = True
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # the received descriptors onto the numbers the caller gave (0, 1, 2 and its pass_fds), out of each other's way
    high = [_dup_high(fd) for fd in job["received"]]
    for fd in job["received"]:
        os.close(fd)
    for fd, target in zip(high, job["fds"]):
        os.dup2(fd, target)  # inheritable, as Popen leaves stdio and pass_fds
    for fd in high:
        if fd not in job["fds"]:
            os.close(fd)
    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    if "numpy" in sys.modules:  # a fresh interpreter seeds numpy's global generator anew (random reseeds at fork)
        sys.modules["numpy"].random.seed()
    args = job["args"]
    _name_process(args)
    import builtins
    import types
    main = types.ModuleType("__main__")  # a new __main__, not the server's
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    if args[0] == "-m":
        import runpy
        sys.argv = [args[1], *args[2:]]
        sys.path[0] = os.getcwd()  # as `python -m` has it ("-c" has "", the working folder, as the server)
        runpy._run_module_as_main(args[1], alter_argv=True)
    elif args[0] == "-c":
        sys.argv = ["-c", *args[2:]]
        exec(compile(args[1], "<string>", "exec"), main.__dict__)
    else:
        raise SystemExit(f"fork server: only -c and -m are served, not {args[0]!r}")


def _dup_high(fd: int) -> int:
    import fcntl
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 64)


def _name_process(args: list[str]) -> None:
    """The child's name in ps and /proc/<pid>/comm: the module it runs (its command line is the server's)."""
    if args[0] != "-m":
        return
    try:
        import ctypes
        ctypes.CDLL(None).prctl(15, args[1].rsplit(".", 1)[-1][:15].encode(), 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass

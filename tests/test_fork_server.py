"""The fork server (build_rules/plumbing/fork_server.py): a child it forks is what `python -c`/`-m` would be for the
caller (arguments, environment, working folder, stdio, extra descriptors, exit code or signal), forks from one server
per environment, and falls back to a fresh interpreter when it cannot serve."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from build_rules.plumbing import fork_server

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def env(monkeypatch) -> dict:
    monkeypatch.delenv(fork_server.SWITCH, raising=False)
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))


def start(args, env, **kwargs):
    return fork_server.python_process(args, env=env, start_server=True, **kwargs)


def server_pid(preload: tuple = ()) -> int:
    return fork_server._servers[preload].process.pid


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_a_forked_child_gets_the_callers_arguments_environment_folder_stdio_and_descriptors(env, tmp_path):
    read_fd, write_fd = os.pipe()
    code = textwrap.dedent(f"""
        import json, os, sys
        line = sys.stdin.readline()
        os.write({write_fd}, b"through the passed descriptor")
        print(json.dumps({{"argv": sys.argv, "cwd": os.getcwd(), "mine": os.environ["MINE"], "line": line,
                           "main": __name__, "path0": sys.path[0]}}))
        print("to stderr", file=sys.stderr)
        sys.exit(3)
    """)
    proc = start(["-c", code, "one", "two"], dict(env, MINE="yes"), cwd=tmp_path, stdin=subprocess.PIPE,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(write_fd,))
    os.close(write_fd)
    assert not isinstance(proc, subprocess.Popen)  # forked, not a fresh interpreter
    assert parent_of(proc.pid) == server_pid()
    out, err = proc.communicate(b"hello\n")
    assert proc.returncode == 3
    assert json.loads(out) == {"argv": ["-c", "one", "two"], "cwd": str(tmp_path), "mine": "yes", "line": "hello\n",
                               "main": "__main__", "path0": ""}
    assert err == b"to stderr\n"
    assert os.read(read_fd, 100) == b"through the passed descriptor"
    os.close(read_fd)


def test_a_module_runs_as_main_with_its_arguments_and_the_name_of_the_module(env, tmp_path):
    (tmp_path / "job.py").write_text("import sys, pathlib\nif __name__ == '__main__':\n"
                                     "    print(sys.argv[1:], pathlib.Path('/proc/self/comm').read_text().strip())\n")
    proc = start(["-m", "job", "a", "b"], env, cwd=tmp_path, stdout=subprocess.PIPE)
    assert proc.stdout.read() == b"['a', 'b'] job\n"
    assert proc.wait(timeout=60) == 0


def test_an_exception_prints_its_traceback_and_exits_1_and_a_kill_reports_the_signal(env):
    proc = start(["-c", "raise ValueError('broken on purpose')"], env, stderr=subprocess.PIPE)
    assert proc.wait(timeout=60) == 1
    assert proc.stderr.read().decode().rstrip().endswith("ValueError: broken on purpose")
    proc = start(["-c", "import time; time.sleep(600)"], env)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.5)
    assert proc.poll() is None
    proc.kill()
    assert proc.wait(timeout=60) == -signal.SIGKILL


def test_children_of_a_forked_child_fork_too_while_its_environment_is_the_servers(env):
    code = textwrap.dedent("""
        import os, subprocess
        from build_rules.plumbing import fork_server
        ask = "from build_rules.plumbing import fork_server; print(fork_server.FORKED, os.getppid())"
        same = fork_server.python_process(["-c", "import os; " + ask], stdout=subprocess.PIPE)
        other = fork_server.python_process(["-c", "import os; " + ask], env=dict(os.environ, OTHER="1"),
                                           stdout=subprocess.PIPE)
        print(same.stdout.read().decode().strip(), "|", other.stdout.read().decode().strip(), "|", os.getpid())
    """)
    proc = start(["-c", code], env, stdout=subprocess.PIPE)
    same, other, child = proc.stdout.read().decode().strip().split(" | ")
    assert proc.wait(timeout=60) == 0
    assert same == f"True {server_pid()}"  # asked the same server
    assert other == f"False {child}"  # another environment: a fresh interpreter, its own child


def test_numpy_draws_differ_between_children_as_between_fresh_interpreters(env):
    code = "import numpy; print(numpy.random.rand())"
    draws = {start(["-c", code], env, stdout=subprocess.PIPE).stdout.read() for _ in range(3)}
    assert len(draws) == 3


def test_a_new_environment_gets_a_new_server_and_the_old_one_ends_after_its_children(env, tmp_path):
    held = start(["-c", "import sys; sys.stdin.read()"], env, stdin=subprocess.PIPE)  # runs until the test lets go
    old = fork_server._servers[()].process
    quick = start(["-c", "print('quick')"], dict(env, OTHER="1"), stdout=subprocess.PIPE)
    assert quick.stdout.read() == b"quick\n" and quick.wait(timeout=60) == 0
    assert server_pid() != old.pid
    assert old.poll() is None  # its child still runs; it reports that child's end
    held.stdin.close()
    assert held.wait(timeout=60) == 0
    old.wait(timeout=30)


def test_a_change_of_the_tools_own_settings_keeps_the_server_and_the_child_sees_the_callers_value(env):
    """BUILD_RULES_* are read by the tool's modules after the fork, never at interpreter start: a new value keeps the
    server (a restart costs ~2 s with torch) and reaches the child; any other change still gets a new server."""
    ask = "import os; print(os.environ.get('BUILD_RULES_SOME_SETTING'), os.getppid())"
    first = start(["-c", ask], dict(env, BUILD_RULES_SOME_SETTING="a"), stdout=subprocess.PIPE)
    assert first.stdout.read().decode().split() == ["a", str(server_pid())] and first.wait(timeout=60) == 0
    server = server_pid()
    second = start(["-c", ask], dict(env, BUILD_RULES_SOME_SETTING="b"), stdout=subprocess.PIPE)
    assert second.stdout.read().decode().split() == ["b", str(server)] and second.wait(timeout=60) == 0
    other = start(["-c", ask], dict(env, BUILD_RULES_SOME_SETTING="b", OTHER="1"), stdout=subprocess.PIPE)
    assert other.stdout.read().decode().split() == ["b", str(server_pid())] and other.wait(timeout=60) == 0
    assert server_pid() != server


def test_a_server_whose_start_prints_still_serves(env, tmp_path):
    """A sitecustomize (a user's, or the tests' spies) may print while the server starts: it still starts, and is
    used (a failed start would cost every later stage a second interpreter start)."""
    (tmp_path / "sitecustomize.py").write_text("print('hello from sitecustomize')\n")
    chatty = dict(env, PYTHONPATH=os.pathsep.join((str(tmp_path), env["PYTHONPATH"])))
    proc = start(["-c", "print('child')"], chatty, stdout=subprocess.PIPE)
    assert not isinstance(proc, subprocess.Popen)
    assert proc.stdout.read() == b"child\n" and proc.wait(timeout=60) == 0


def test_switched_off_or_without_a_server_a_fresh_interpreter_runs_it(env, monkeypatch):
    code = "from build_rules.plumbing import fork_server; print(fork_server.FORKED)"
    monkeypatch.setenv(fork_server.SWITCH, "0")
    switched = start(["-c", code], env, stdout=subprocess.PIPE)
    assert isinstance(switched, subprocess.Popen)
    assert switched.stdout.read() == b"False\n" and switched.wait(timeout=60) == 0
    monkeypatch.delenv(fork_server.SWITCH)
    unasked = fork_server.python_process(["-c", code], env=env, stdout=subprocess.PIPE)  # no server started here
    assert isinstance(unasked, subprocess.Popen)
    assert unasked.stdout.read() == b"False\n" and unasked.wait(timeout=60) == 0


def test_a_torch_server_serves_the_stages_that_import_torch(env):
    from build_rules import stage_table
    assert [m for m in sorted(stage_table.worker_modules()) if stage_table.imports_torch(m)] == \
        ["aimet", "export", "verify"]
    code = "import os, sys; print('torch' in sys.modules, os.getppid())"
    plain = start(["-c", code], env, stdout=subprocess.PIPE)
    with_torch = start(["-c", code], env, stdout=subprocess.PIPE, preload=("torch",))
    assert plain.stdout.read().decode() == f"False {server_pid()}\n"
    assert with_torch.stdout.read().decode() == f"True {server_pid(('torch',))}\n"
    assert plain.wait(timeout=60) == 0 and with_torch.wait(timeout=60) == 0


def test_a_childs_collections_leave_the_servers_objects_alone(env):
    """The server's objects (numpy's, onnx's: what it imported) are in the collector's permanent generation when it
    forks: a child's collections, and the one at its exit, never walk them (each walk wrote to every page they live
    on, copying it: a tiny net's stage processes took 8.1 s of CPU, 5.5 s with them frozen; docs/benchmarks.md).
    The child's own objects are collected as usual."""
    code = textwrap.dedent("""
        import gc, sys
        frozen = gc.get_freeze_count()
        class Cycle:
            pass
        a, b = Cycle(), Cycle()
        a.other, b.other = b, a
        del a, b
        print(frozen > 10000, "numpy" in sys.modules, gc.collect() >= 2)
    """)
    proc = start(["-c", code], env, stdout=subprocess.PIPE)
    assert not isinstance(proc, subprocess.Popen)
    assert proc.stdout.read() == b"True True True\n" and proc.wait(timeout=60) == 0


def test_a_stage_process_ends_with_its_exit_handlers_and_output_but_no_teardown(tmp_path):
    """stage_main._end: the atexit handlers run (a scratch folder's weakref.finalize among them) and buffered output
    is written, with the stage's exit code; the interpreter's teardown (objects released one by one, a collection) is
    skipped: ~0.16 s of CPU of a small stage in the torch server's child."""
    scratch = tmp_path / "scratch"
    code = textwrap.dedent(f"""
        import atexit, shutil, sys, weakref
        sys.path.insert(0, {str(ROOT)!r})
        from build_rules.stage_main import _end
        class Owner:
            def __del__(self):
                print("torn down")
        owner = Owner()
        import os; os.makedirs({str(scratch)!r})
        weakref.finalize(owner, shutil.rmtree, {str(scratch)!r})
        atexit.register(print, "exit handler")
        print("buffered", end=" ")
        print("to stderr", file=sys.stderr, end="")
        _end(3)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (3, "buffered exit handler\n", "to stderr")
    assert not scratch.exists()


def test_the_simplify_stage_imports_onnxsim_without_torch_or_sympy_and_sympy_imports_after():
    """onnxsim's __init__ imports torch, and its model summaries' module sympy (0.94 s of CPU of a tiny graph's 1.27 s
    simplify stage): neither is needed to simplify a model of static shapes (plumbing/lean_imports.py). The stage
    process imports neither; a later `import sympy` in it (a user's hook) works as usual."""
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from build_rules.plumbing.lean_imports import onnxsim_simplify
        simplify = onnxsim_simplify()
        print(simplify.__module__, "torch" in sys.modules, "sympy" in sys.modules)
        import sympy
        print(sympy.Symbol("x") + 1)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["onnxsim.onnx_simplifier False False", "x + 1"]


def test_the_server_ends_with_its_caller(env, tmp_path):
    """Its caller killed outright: the server sees its pipe close and ends, once its children have."""
    code = textwrap.dedent(f"""
        import subprocess, sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from build_rules.plumbing import fork_server
        child = fork_server.python_process(["-c", "import time; time.sleep(1)"], start_server=True)
        print(fork_server._servers[()].process.pid, child.pid, flush=True)
        time.sleep(600)
    """)
    caller = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE)
    server, child = map(int, caller.stdout.readline().split())
    caller.kill()
    caller.wait()
    deadline = time.monotonic() + 30
    while fork_server.alive(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not fork_server.alive(server) and not fork_server.alive(child)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to connect as another user")
def test_another_user_is_refused(env):
    """The server's socket is abstract (no file, no mode): a connection from another uid is closed unserved."""
    marker = Path("/tmp") / f"fork-server-refused-{os.getpid()}"
    marker.unlink(missing_ok=True)
    assert start(["-c", "pass"], env).wait(timeout=60) == 0
    address = fork_server._servers[()].address
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # as nobody, in a fork of this process (the interpreter's folder may be closed to nobody)
        try:
            os.setuid(65534)
            fork_server._Forked(address, ["-c", f"open({str(marker)!r}, 'w')"], {}, "/", None, None, None, ())
            os.write(write_fd, b"served")
        except OSError as e:
            os.write(write_fd, f"refused: {e}".encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    os.waitpid(pid, 0)
    answer = os.read(read_fd, 1000).decode()
    os.close(read_fd)
    assert answer.startswith("refused: "), answer  # closed unread: a reset, or an empty answer
    time.sleep(0.5)
    assert not marker.exists()

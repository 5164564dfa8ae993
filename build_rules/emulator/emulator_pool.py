"""Worker processes that run a job's items on the HTP emulator, one session each (emulator_runs.py's local backend).

A worker is a fresh interpreter or a child of the fork server (plumbing/fork_server.py), never a fork of the stage
process (it may hold QNN state, and QNN's threads do not survive a fork), started with two pipes. It waits for a
machine-wide slot (emulator_slots.py), pins itself to the slot's core, calls the job's opener once (e.g. loads the
binary: one session per worker) and then applies what the opener returned to each item it is sent, sending each
result back. The parent hands out items as workers become free and
yields results in item order, so a slow sample on one worker never reorders anything.

Closing the parent's iterator (an early verdict, an error, Ctrl-C) kills the workers: the items not yet sent are never
run, and no worker outlives the job.
"""
from __future__ import annotations

import importlib
import os
import subprocess
import time
import traceback
from collections import deque
from collections.abc import Iterator
from multiprocessing.connection import Connection, wait
from pathlib import Path

from ..plumbing import fork_server

_ROOT = str(Path(__file__).resolve().parent.parent.parent)  # where this build_rules lives: the workers import the same one
_IN_FLIGHT = 2  # items sent ahead to each worker, so it never waits on the parent between two items


class WorkerError(RuntimeError):
    """A worker died or could not report an error of its own."""


def resolve(opener: str):
    """'package.module:function' -> the function."""
    module, _, name = opener.partition(":")
    return getattr(importlib.import_module(module), name)


class _Worker:
    def __init__(self, opener: str, args: tuple):
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        code = (f"import sys; sys.path.insert(0, {_ROOT!r}); from build_rules.emulator.emulator_pool import serve; "
                f"serve({to_child_r}, {from_child_w}, {os.getpid()})")
        try:
            self.process = fork_server.python_process(["-c", code], pass_fds=(to_child_r, from_child_w),
                                                      stdin=subprocess.DEVNULL)
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self.send = Connection(to_child_w, readable=False)
        self.receive = Connection(from_child_r, writable=False)
        self.ready = False
        self.ready_at: float | None = None  # holding its slot from then (emulator_slots.count_seconds at stop)
        self.items: deque[int] = deque()  # sent, not yet answered
        self.send.send((opener, args))

    def stop(self, kill: bool) -> None:
        if self.ready_at is not None:
            from . import emulator_slots
            emulator_slots.count_seconds(time.monotonic() - self.ready_at)
            self.ready_at = None
        if self.process.poll() is None and not kill:
            try:
                self.send.send(None)
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.send.close()
        self.receive.close()


def run(opener: str, args: tuple, items: list, workers: int, what: str = "samples",
        counter=None) -> Iterator[tuple[int, object]]:
    """(index, opener(*args)(item)) for each item, in item order, from `workers` worker processes. counter.done (a
    progress counter) counts each item as it arrives from any worker."""
    pool = [_Worker(opener, args) for _ in range(max(1, min(workers, len(items))))]
    if counter is not None:  # the progress line: "120/200 samples on 2 emulator workers"
        counter.where = f"{len(pool)} emulator worker{'s' if len(pool) > 1 else ''}"
    pending = deque(range(len(items)))
    finished: dict[int, object] = {}
    next_index = 0
    killed = True
    try:
        while next_index < len(items):
            while next_index in finished:
                yield next_index, finished.pop(next_index)
                next_index += 1
            if next_index >= len(items):
                break
            for worker in pool:
                while worker.ready and pending and len(worker.items) < _IN_FLIGHT:
                    index = pending.popleft()
                    worker.send.send((index, items[index]))
                    worker.items.append(index)
            for connection in wait([w.receive for w in pool]):
                worker = next(w for w in pool if w.receive is connection)
                try:
                    message = connection.recv()
                except EOFError:
                    code = worker.process.wait()
                    doing = f" while running item {worker.items[0]} of {len(items)} {what}" if worker.items else ""
                    raise WorkerError(f"an emulator worker (pid {worker.process.pid}) died with exit code {code}"
                                      f"{doing}; its messages are above in this log") from None
                kind = message[0]
                if kind == "ready":
                    worker.ready, worker.ready_at = True, time.monotonic()
                elif kind == "done":
                    worker.items.popleft()
                    finished[message[1]] = message[2]
                    if counter is not None:
                        counter.done += 1
                else:  # "failed": (kind, index or None, the exception or its text)
                    raise _error(message[2], message[1], what)
        killed = False
    finally:
        for worker in pool:
            worker.stop(kill=killed)


def _error(error, index, what: str) -> BaseException:
    if isinstance(error, BaseException):
        return error
    where = f" on item {index} of the {what}" if index is not None else " while opening"
    return WorkerError(f"an emulator worker failed{where}:\n{error}")


def serve(read_fd: int, write_fd: int, parent: int) -> None:
    """A worker's body: hold a slot, open the job once, run the items it is sent until told to stop."""
    import queue
    import threading

    from . import emulator_slots
    _die_with(parent)
    receive, send = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    try:
        opener, args = receive.recv()
    except EOFError:
        return
    # A thread drains the parent's pipe while this one runs and answers: both sides send large arrays, and two
    # processes each blocked writing to the other would wait forever.
    inbox: queue.Queue = queue.Queue()

    def read() -> None:
        while True:
            try:
                message = receive.recv()
            except (EOFError, OSError):  # the parent is gone without a word (killed): end now, mid-item too
                os._exit(1)
            inbox.put(message)
            if message is None:
                return

    threading.Thread(target=read, name="emulator-worker-inbox", daemon=True).start()
    with emulator_slots.slot(pin=True):
        try:
            apply = resolve(opener)(*args)
        except BaseException as e:
            send.send(("failed", None, _picklable(e)))
            return
        send.send(("ready",))
        while (message := inbox.get()) is not None:
            index, item = message
            try:
                result = apply(item)
            except BaseException as e:
                send.send(("failed", index, _picklable(e)))
                return
            send.send(("done", index, result))


def _die_with(parent: int) -> None:
    """End with the process that started this worker, even when it is killed outright (a stage gets SIGKILL when
    its build is interrupted, and runs no cleanup): Linux's parent-death signal. Ctrl-C reaches the whole process
    group; the parent handles it and ends the workers, which ignore it. SIGTERM ends a worker, whatever disposition
    it inherited (an ignored signal stays ignored across exec)."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the pipe's EOF ends the worker after its current item
        pass
    if os.getppid() != parent and not fork_server.FORKED:  # the parent died before the signal was set
        os._exit(1)  # (a forked worker's parent is the fork server: the pipe's EOF tells instead)


def _picklable(error: BaseException):
    """The exception itself when it survives pickling (a BuildError keeps its type and message), else its text."""
    import pickle
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return "".join(traceback.format_exception(error)).rstrip()

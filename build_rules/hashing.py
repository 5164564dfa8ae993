"""Content hashes for doit: xxh3_128 of file bytes, read only when a file's stat changed.

doit's default checker compares mtime first and then md5; it never refreshes the saved state of
an up-to-date task, so a file touched without changing its bytes is re-hashed on every later run.
Here a stat cache (path -> size, mtime_ns, inode, digest), kept in one small JSON file under out/,
remembers the digest of the current stat: such a file is read once, then never again.
"""
from __future__ import annotations

import atexit
import functools
import inspect
import json
import os
import threading

import xxhash
from doit.dependency import FileChangedChecker

from .files import atomic_write_text

# Read into one reused buffer that stays in the CPU cache between the kernel's copy and the hash: a
# new bytes object per read costs page faults (1 MiB reads: 0.57x `cat`'s throughput; 256 KiB into a
# reused buffer: 0.81x, bench/build_bench.py). mmap would skip the copy, but a file
# truncated while it is hashed would kill doit with SIGBUS.
READ_SIZE = 256 << 10


def file_digest(path: str | os.PathLike) -> str:
    h = xxhash.xxh3_128()
    buffer = bytearray(READ_SIZE)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            h.update(view[:n])
    return h.hexdigest()


def text_digest(text: str) -> str:
    return xxhash.xxh3_128(text.encode()).hexdigest()


class StatCache:
    """path -> (size, mtime_ns, inode, digest); persisted at exit if it changed."""

    def __init__(self, path: str | None = None):
        self.path = path
        self.entries: dict[str, list] = {}
        self.dirty = False
        self.lock = threading.Lock()  # doit -P thread checks files from several threads
        self.bytes_hashed = 0  # for benchmarks: a no-op build must read nothing
        if path and os.path.exists(path):
            try:
                with open(path) as f:
                    self.entries = json.load(f)
            except (OSError, ValueError):
                self.entries = {}  # a damaged cache only costs re-hashing

    def digest(self, path: str, st: os.stat_result) -> str:
        stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
        key = os.path.abspath(path)
        with self.lock:
            entry = self.entries.get(key)
        if entry is not None and entry[:3] == stamp:
            return entry[3]
        digest = file_digest(path)
        with self.lock:
            self.bytes_hashed += st.st_size
            self.entries[key] = stamp + [digest]
            self.dirty = True
        return digest

    def remember(self, path: str, digest: str) -> None:
        """Record a digest known without reading the file (a file just copied from the build cache)."""
        try:
            st = os.stat(path)
        except OSError:
            return
        with self.lock:
            self.entries[os.path.abspath(path)] = [st.st_size, st.st_mtime_ns, st.st_ino, digest]
            self.dirty = True

    def save(self) -> None:
        if self.path and self.dirty:
            with self.lock:
                text = json.dumps(self.entries, separators=(",", ":"))
                self.dirty = False
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            atomic_write_text(self.path, text)


_cache = StatCache()


def use_stat_cache(path: str) -> StatCache:
    """Point the process-wide cache at a file (called once when the build file loads)."""
    global _cache
    if _cache.path != path:
        _cache = StatCache(path)
        atexit.register(_cache.save)
    return _cache


def stat_cache() -> StatCache:
    return _cache


class ContentChecker(FileChangedChecker):
    """doit file_dep checker: state = [size, mtime_ns, digest]; changed means other bytes."""

    def check_modified(self, file_path, file_stat, state):
        size, mtime_ns, digest = state
        if file_stat.st_size != size:
            return True
        if file_stat.st_mtime_ns == mtime_ns:
            return False
        return _cache.digest(file_path, file_stat) != digest

    def get_state(self, dep, current_state):
        st = os.stat(dep)
        if current_state and list(current_state[:2]) == [st.st_size, st.st_mtime_ns]:
            return None  # unchanged: doit keeps the saved state
        return [st.st_size, st.st_mtime_ns, _cache.digest(dep, st)]


class TaskKey:
    """doit uptodate item: the task is stale when its key changed, or when one of its outputs no
    longer has the bytes the task wrote.

    The key holds everything besides input file contents that can change a task's output: the
    stage and its code version, its parameters, the versions of the Python tools it uses and, for
    SDK-dependent stages, the toolchain identity (SDK version and QNN build id).
    doit itself only notices a *missing* target; the saved [size, mtime_ns, digest] of each target
    catches one edited or truncated by hand (read again only when its stat changed).
    """

    # doit asks inspect.signature() of every uptodate callable on every status check (which magic arguments it
    # takes); for a callable object that costs ~35 us, a third of a no-op's check per task. Declared, it is free.
    __signature__ = inspect.Signature([inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                       for name in ("task", "values")])

    def __init__(self, key):
        # key: the dict, or a function that makes it. Made and hashed when first asked for: `doit list`
        # never asks, a no-op build asks for the uptodate key only (not the build cache's).
        # (A dict or a functools.partial: tasks are pickled under `doit -P process`.)
        self._key = key

    @functools.cached_property
    def key(self) -> dict:
        return self._key() if callable(self._key) else self._key

    @functools.cached_property
    def digest(self) -> str:
        return text_digest(json.dumps(self.key, sort_keys=True))

    def configure_task(self, task):
        def save():
            return {"_key": self.digest, "_targets": {t: _stamp(t) for t in task.targets}}
        task.value_savers.append(save)

    def __call__(self, task, values):
        if values.get("_key") != self.digest:
            return False
        saved = values.get("_targets") or {}
        return all(_target_unchanged(t, saved.get(t)) for t in task.targets)

    def __repr__(self):
        return f"TaskKey({self.digest})"


def _stamp(path: str) -> list | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return [st.st_size, st.st_mtime_ns, _cache.digest(path, st)]


def _target_unchanged(path: str, saved) -> bool:
    if not saved:
        return False
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    if st.st_size != saved[0]:
        return False
    if st.st_mtime_ns == saved[1]:
        return True
    return _cache.digest(path, st) == saved[2]

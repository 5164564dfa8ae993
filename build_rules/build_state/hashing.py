"""Content hashes for doit: xxh3_128 of file bytes, read only when a file's stat changed.

doit's default checker compares mtime first and then md5; it never refreshes the saved state of
an up-to-date task, so a file touched without changing its bytes is re-hashed on every later run.
Here a stat cache (path -> size, mtime_ns, inode, digest), kept in one small JSON file under out/,
remembers the digest of the current stat: such a file is read once, then never again.
"""
from __future__ import annotations

import atexit
import errno
import inspect
import json
import marshal
import os
import threading

import xxhash
from doit.dependency import FileChangedChecker

from ..plumbing.files import atomic_write_text

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
        self._entries: dict[str, list] | None = None
        self.dirty = False
        self.lock = threading.Lock()  # doit -P thread checks files from several threads
        self.bytes_hashed = 0  # for benchmarks: a no-op build must read nothing

    @property
    def entries(self) -> dict[str, list]:
        # Read on first use: a no-op build never asks (a file whose stat is the one doit saved is not digested),
        # and parsing the file was ~0.6 ms of each load with ten models.
        if self._entries is None:
            entries = {}
            if self.path and os.path.exists(self.path):
                try:
                    with open(self.path) as f:
                        entries = json.load(f)
                except (OSError, ValueError):
                    entries = {}  # a damaged cache only costs re-hashing
            self._entries = entries
        return self._entries

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


class KeyDigests:
    """A task key's digest (xxh3 of its canonical JSON: sorted keys) by a fingerprint of the key as it is made
    (xxh3 of marshal.dumps: the same dicts in the same order give the same bytes), persisted at exit if it grew.

    The canonical JSON is what a task's state records (doit.json's `_key`) and what the build cache is keyed by; making
    it for every task of a no-op was a fifth of the no-op's checks (json.dumps with sort_keys: ~90 us a key; marshal
    is ~4 x faster). Equal fingerprints mean equal keys, so a digest found here is the digest the key would get; a key
    made differently (another order, a new field) only misses and is digested again.
    """

    def __init__(self, path: str | None = None):
        self.path = path
        self.entries: dict[str, str] | None = None  # read on first use: `doit list` asks for no digest
        self.used: dict[str, str] = {}
        self.added = False
        self.lock = threading.Lock()

    def digest(self, key: dict) -> str:
        try:
            fingerprint = xxhash.xxh3_128_hexdigest(marshal.dumps(key, 2))  # version 2: no back-references
        except ValueError:  # not marshallable: digested every time
            return text_digest(json.dumps(key, sort_keys=True))
        with self.lock:
            if self.entries is None:
                self.entries = self._read()
            digest = self.entries.get(fingerprint)
        if digest is None:
            digest = text_digest(json.dumps(key, sort_keys=True))
            with self.lock:
                self.entries[fingerprint] = digest
                self.added = True
        with self.lock:
            self.used[fingerprint] = digest
        return digest

    def _read(self) -> dict[str, str]:
        if not self.path:
            return {}
        try:
            with open(self.path) as f:
                entries = json.load(f)
            return entries if isinstance(entries, dict) else {}
        except (OSError, ValueError):
            return {}  # a damaged file only costs digesting again

    def save(self) -> None:
        """The digests this run used, and the older ones while they are fewer than these (so a partial build keeps
        the rest, and keys of tasks that are gone do not pile up)."""
        if not (self.path and self.added):
            return
        with self.lock:
            kept = dict(self.used)
            if len(self.entries) <= 2 * len(self.used) + 1000:
                kept = {**self.entries, **kept}
            self.added = False
            text = json.dumps(kept, separators=(",", ":"))
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        atomic_write_text(self.path, text)


_key_digests = KeyDigests()


def use_key_digests(path: str) -> KeyDigests:
    """Point the process-wide key digests at a file (called once when the build file loads)."""
    global _key_digests
    if _key_digests.path != path:
        _key_digests = KeyDigests(path)
        atexit.register(_key_digests.save)
    return _key_digests


# doit stats a file several times while it checks the tasks: a target for the task key's stamps (TaskKey), again for
# its own missing-target test, and again as the file_dep of each task that reads it. Until a task runs nothing changes
# them, so the first stat serves the rest (a no-op on 30 model folders made 8,260 stats for 960 tasks). The reporter
# (summary.py) turns this on when doit starts a run and off before the first task's actions: with another reporter it
# stays off.
_stats: dict | None = None  # path -> os.stat_result, or None for a missing file


def remember_stats() -> None:
    global _stats
    _stats = {}


def forget_stats() -> None:
    global _stats
    _stats = None


def stat(path: str) -> os.stat_result:
    memo = _stats
    if memo is None:
        return os.stat(path)
    try:
        st = memo[path]
    except KeyError:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            st = None
        memo[path] = st
    if st is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
    return st


class ContentChecker(FileChangedChecker):
    """doit file_dep checker: state = [size, mtime_ns, digest]; changed means other bytes."""

    def exists(self, file_path):
        try:
            stat(file_path)
        except OSError:
            return False
        return True

    def info(self, file_path):
        return stat(file_path)

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
        self._made: dict | None = None
        self._digest: str | None = None

    # Plain properties, not functools.cached_property: its first access takes a lock (~3.8 us against ~0.3 us),
    # twice per task in every no-op. Two threads computing the same value at once is harmless.
    @property
    def key(self) -> dict:
        if self._made is None:
            self._made = self._key() if callable(self._key) else self._key
        return self._made

    @property
    def digest(self) -> str:
        if self._digest is None:
            self._digest = _key_digests.digest(self.key)
        return self._digest

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
        st = stat(path)
    except FileNotFoundError:
        return False
    if st.st_size != saved[0]:
        return False
    if st.st_mtime_ns == saved[1]:
        return True
    return _cache.digest(path, st) == saved[2]


class OptionalFiles:
    """doit uptodate: files a task reads when they exist but must not make (a report reads the checks that ran and
    marks the others; a check.json as a file_dep would run every missing check first). Up to date while each file's
    size and mtime (or its absence) is what it was when the task last ran; one stat a file, only when doit checks
    the task."""

    __signature__ = TaskKey.__signature__

    def __init__(self, paths: list[str]):
        self.paths = paths

    def stamp(self) -> list:
        found = []
        for path in self.paths:
            try:
                st = os.stat(path)
                found.append([st.st_size, st.st_mtime_ns])
            except FileNotFoundError:
                found.append(None)
        return found

    def configure_task(self, task):
        task.value_savers.append(lambda: {"_optional_files": self.stamp()})

    def __call__(self, task, values):
        return values.get("_optional_files") == self.stamp()

"""A doit state backend that survives kill -9, and keeps one doit per repo at a time.

doit's own backends write their file once, when doit exits cleanly: a killed build forgets every
task it finished and redoes hours of compiles. Here every change is appended to a journal beside a
JSON snapshot and handed to the OS at once; loading replays the journal over the snapshot (a torn
last line from a kill is ignored), and a clean exit folds the journal into a new snapshot.

Registered with doit through the entry point in build_rules' pyproject.toml (group doit.BACKEND).
"""
from __future__ import annotations

import fcntl
import json
import os
import sys

from .plumbing.files import atomic_write_text

class JournalDB:
    desc = "JSON snapshot + per-change journal (kill-safe), one doit per repo"

    def __init__(self, name, codec, *, module_name=None):
        self.name = name
        self.codec = codec
        self.journal_path = f"{name}.journal"
        # Opened (locked, loaded) on first use: `doit list` never reads the state, so it neither pays
        # for loading it nor waits for a build that holds the lock.
        self._db: dict | None = None

    def _state(self) -> dict:
        if self._db is None:
            os.makedirs(os.path.dirname(os.path.abspath(self.name)), exist_ok=True)
            self._lock = _acquire(f"{self.name}.lock")
            self._dirty = False  # a no-op build leaves the snapshot alone (rewriting it is ~3 ms)
            self._db = self._load()
            self._journal = open(self.journal_path, "a", encoding="utf-8")
        return self._db

    def _load(self) -> dict:
        db = {}
        if os.path.exists(self.name):
            with open(self.name, encoding="utf-8") as f:
                text = f.read()
            try:
                db = self.codec.decode(text) if text.strip() else {}
            except ValueError:
                db = {}  # a damaged snapshot only costs a rebuild, never a wrong "up to date"
        if os.path.exists(self.journal_path):
            with open(self.journal_path, encoding="utf-8") as f:
                for line in f:
                    try:
                        op = json.loads(line)
                    except ValueError:
                        break  # the line a kill cut short: everything before it is whole
                    _apply(db, op, self.codec)
                    self._dirty = True
        return db

    def _log(self, op: list) -> None:
        self._dirty = True
        self._journal.write(json.dumps(op) + "\n")
        self._journal.flush()  # in the OS now: a kill -9 of this process cannot lose it

    def set(self, task_id, dependency, value):
        self._state().setdefault(task_id, {})[dependency] = value
        self._log(["set", task_id, dependency, self.codec.encode(value)])

    def get(self, task_id, dependency):
        return self._state().get(task_id, {}).get(dependency)

    def in_(self, task_id):
        return task_id in self._state()

    def remove(self, task_id):
        db = self._state()
        if task_id in db:
            del db[task_id]
            self._log(["remove", task_id])

    def remove_all(self):
        self._state().clear()
        self._log(["remove_all"])

    def dump(self):
        if self._db is None:
            return  # never opened
        if self._dirty:
            atomic_write_text(self.name, self.codec.encode(self._db))
            open(self.journal_path, "w").close()  # folded into the snapshot (replaying it again is harmless)
        self._journal.close()
        self._db = None  # a later use opens (and locks) it again
        _release(self._lock)


def _apply(db: dict, op: list, codec) -> None:
    if op[0] == "set":
        db.setdefault(op[1], {})[op[2]] = codec.decode(op[3])
    elif op[0] == "remove":
        db.pop(op[1], None)
    elif op[0] == "remove_all":
        db.clear()


def _acquire(path: str):
    """POSIX lock on the repo's state: a second doit waits for the first (the kernel drops the lock
    of a killed process). Per-process, so several in-process runs (tests) do not block themselves."""
    f = open(path, "a+")
    try:
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or "unknown"
        print(f"doit: another doit is running in this repo (pid {holder}); waiting for it to finish "
              f"(lock: {path})", file=sys.stderr, flush=True)
        fcntl.lockf(f, fcntl.LOCK_EX)
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    return f


def _release(f) -> None:
    if not f.closed:
        fcntl.lockf(f, fcntl.LOCK_UN)
        f.close()

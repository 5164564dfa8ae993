"""Writing outputs so that a reader never sees half a file.

doit takes a target that exists as built, whatever its bytes; an interrupted write must therefore
leave either the old file or no file, never a truncated one: write beside, fsync, os.replace.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
import weakref
from pathlib import Path


# mkstemp makes its file 0600; an output gets the mode open() would give it (0644 under the usual umask 022), as
# the files stages write themselves have: tune's proposals and the bundles' JSON are read by other users and tools.
_UMASK = os.umask(0o022)
os.umask(_UMASK)


def atomic_write_bytes(path: str | os.PathLike, data: bytes, fsync: bool = True) -> None:
    """fsync=False: for a cache whose torn entry is a miss (the emulator output memo), not for an output."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | os.PathLike, data) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def publish(staged: Path, target: Path) -> None:
    """Move a finished file from the staging folder onto its target, atomically."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(staged, "rb") as f:
        os.fsync(f.fileno())
    try:
        os.replace(staged, target)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        # staging on another file system (a mount or a link): copy beside the target, then rename
        atomic_write_bytes(target, Path(staged).read_bytes())


def replace_folder(staged: Path, target: Path) -> None:
    """Swap a finished folder in: two renames, so readers see the old folder or the new one."""
    target.parent.mkdir(parents=True, exist_ok=True)
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    if target.exists():
        os.replace(target, old)
    os.replace(staged, target)
    remove_quietly(old)


def scratch_folder(owner, prefix: str) -> Path:
    """A new folder under $TMPDIR that lives as long as `owner`: removed when owner is freed or the process exits,
    whichever comes first (a tune's candidates were 14 MB each, and every tune left its folders behind)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    weakref.finalize(owner, shutil.rmtree, folder, ignore_errors=True)
    return folder


def remove_quietly(*paths: str | os.PathLike) -> None:
    for p in paths:
        p = Path(p)
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            _unlink(p)


def _unlink(p) -> None:
    try:
        os.unlink(p)
    except FileNotFoundError:
        pass


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike):
    """Held by one process at a time (flock on `path`, made if missing): the others wait. The kernel drops it when
    the holder exits, also when it is killed, so a crash leaves nothing to clean up."""
    import fcntl
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)

"""A content-addressed build cache: a stage's outputs, stored under the digest of everything that made them.

An entry's key is xxh3_128 of: the task key (stage, version, parameters, tool versions, toolchain identity),
the content digest of every file the task depends on, and the source code of the stage processes
(build_rules/stages, toolchains, ...). When doit finds a task stale and its key is in the cache, the runner
copies the stored outputs into place (atomically, each digest checked) and returns the stored values
without starting the stage process: flipping a setting back costs a file copy, whatever the model size.

Where: $BUILD_RULES_CACHE (a folder; a team or CI can share one), or out/.cache by default;
BUILD_RULES_CACHE=off disables it. Entries are folders <key[:2]>/<key>/ with entry.json, the output files and
the stage's log; an entry is renamed into place only when complete, so several builds may share a cache.
A hit refreshes the entry's mtime: prune by last use with

    python -m build_rules.cache info
    python -m build_rules.cache prune --max-size 5G --older-than 30d
    python -m build_rules.cache clear

(or delete the folder: nothing else refers to it). A shared second tier on S3 (BUILD_RULES_REMOTE_CACHE) is
asked when this one misses and given what it stores: build_rules/build_state/remote_cache.py.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import time
import uuid
from pathlib import Path

import xxhash

ENV = "BUILD_RULES_CACHE"
DEFAULT = "out/.cache"
OFF = ("off", "0", "no", "none", "false")
_CHUNK = 1 << 20
# The code whose change may change a stage's outputs: every module of the package. What stage processes import
# reaches nearly every room (stages -> quantization, measuring, emulator, bundles, configuration ...: 110 of 136
# modules); the list this replaced (stages, toolchains and four files) let an edit of quantization/ or measuring/
# restore outputs its old code made. An edit anywhere now misses once; a wrong hit is worse.
_CODE = (".",)


def cache_root(environ=os.environ) -> Path | None:
    """The cache folder, or None when the cache is off."""
    value = environ.get(ENV)
    if value is None:
        return Path(DEFAULT)
    value = value.strip()
    if not value or value.lower() in OFF:
        return None
    return Path(value).expanduser()


@functools.cache
def code_digest() -> str:
    package = Path(__file__).resolve().parent
    h = xxhash.xxh3_128()
    for name in _CODE:
        path = package / name
        files = sorted(f for f in path.rglob("*.py") if "__pycache__" not in f.parts) if path.is_dir() else [path]
        for f in files:
            h.update(str(f.relative_to(package)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def entry_key(task_key: str, file_digests: list[str]) -> str:
    return xxhash.xxh3_128(json.dumps([task_key, code_digest(), file_digests]).encode()).hexdigest()


class Cache:
    def __init__(self, root: Path | None, remote=None):
        self.root = Path(root) if root is not None else None  # None: the local tier is off
        self.remote = remote  # remote_cache.RemoteCache or None

    def _entry(self, key: str) -> Path:
        return self.root / key[:2] / key

    def restore(self, key: str, targets: list[str], log: str | None = None, relocatable: bool = False):
        """Put the stored outputs onto `targets` and return the stored values, or None (not cached, or damaged).
        relocatable: the entry may have been made for targets elsewhere with the same file names.
        The local tier first, then the remote one, whose hit the local tier then keeps."""
        values = self._restore_local(key, targets, log, relocatable) if self.root is not None else None
        if values is None and self.remote is not None:
            manifest = self.remote.restore(key, targets, log, relocatable)
            if manifest is not None:
                values = manifest.get("values", {})
                self._store_local(key, targets, values, log, manifest.get("stage", ""))
        return values

    def store(self, key: str, targets: list[str], values, log: str | None = None, stage: str = "") -> None:
        """Keep a finished stage's outputs in the local tier and upload them to the remote one (if writable)."""
        self._store_local(key, targets, values, log, stage)
        if self.remote is not None:
            self.remote.store(key, targets, values, log, stage)

    def _restore_local(self, key: str, targets: list[str], log: str | None, relocatable: bool):
        entry = self._entry(key)
        try:
            meta = json.loads((entry / "entry.json").read_text())
        except (OSError, ValueError):
            return None
        stored = meta.get("targets") or []
        if relocatable:
            if [Path(t).name for t in stored] != [Path(t).name for t in targets]:
                return None
        elif stored != list(targets):
            return None
        temps = []
        try:
            for i, target in enumerate(targets):
                target_path = Path(target)
                target_path.parent.mkdir(parents=True, exist_ok=True)
                tmp = target_path.with_name(f".{target_path.name}.{uuid.uuid4().hex[:8]}.restore")
                temps.append(tmp)
                if _copy(entry / f"f{i}", tmp) != meta["digests"][i]:
                    raise ValueError(f"damaged cache entry {entry}")
        except OSError:  # e.g. pruned meanwhile: a miss
            for tmp in temps:
                _unlink(tmp)
            return None
        except (ValueError, KeyError, IndexError):  # damaged entry: never serve it again
            for tmp in temps:
                _unlink(tmp)
            shutil.rmtree(entry, ignore_errors=True)
            return None
        for tmp, target in zip(temps, targets):
            os.replace(tmp, target)
        from .build_state.hashing import stat_cache
        for target, digest in zip(targets, meta["digests"]):
            stat_cache().remember(target, digest)  # doit stamps the restored targets without reading them again
        if log:
            try:
                stored_log = (entry / "log").read_bytes()
            except OSError:
                stored_log = b""
            Path(log).parent.mkdir(parents=True, exist_ok=True)
            Path(log).write_bytes(f"[restored from the build cache: {entry}]\n".encode() + stored_log)
        try:
            os.utime(entry / "entry.json")  # last use, for `prune`
        except OSError:
            pass
        return meta.get("values", {})

    def _store_local(self, key: str, targets: list[str], values, log: str | None, stage: str) -> None:
        """Copy finished outputs into a new entry (best effort: a full or read-only cache only loses the entry)."""
        if self.root is None:
            return
        entry = self._entry(key)
        if entry.exists():
            return
        tmp = self.root / "tmp" / f"{os.getpid()}-{uuid.uuid4().hex}"
        try:
            tmp.mkdir(parents=True)
            digests = [_copy(Path(target), tmp / f"f{i}") for i, target in enumerate(targets)]
            if log and Path(log).is_file():
                shutil.copyfile(log, tmp / "log")
            (tmp / "entry.json").write_text(json.dumps({"stage": stage, "targets": list(targets), "digests": digests,
                                                        "values": values, "created": time.time()}))
            entry.parent.mkdir(parents=True, exist_ok=True)
            os.rename(tmp, entry)  # atomic; fails if another build stored the same key first
        except OSError:
            pass
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    # --- maintenance ---------------------------------------------------------------------------

    def entries(self) -> list[tuple[float, int, Path]]:
        """(last use, bytes, folder) of every entry."""
        found = []
        if not self.root.is_dir():
            return found
        for shard in self.root.iterdir():
            if len(shard.name) != 2 or not shard.is_dir():
                continue
            for entry in shard.iterdir():
                try:
                    used = (entry / "entry.json").stat().st_mtime
                    size = sum(f.stat().st_size for f in entry.iterdir())
                except OSError:
                    continue
                found.append((used, size, entry))
        return found

    def prune(self, max_bytes: int | None = None, older_than_s: float | None = None, now: float | None = None) -> dict:
        """Drop entries unused for longer than older_than_s, then the least recently used until under max_bytes."""
        now = time.time() if now is None else now
        entries = sorted(self.entries())
        removed, freed = 0, 0
        kept = []
        for used, size, entry in entries:
            if older_than_s is not None and now - used > older_than_s:
                shutil.rmtree(entry, ignore_errors=True)
                removed, freed = removed + 1, freed + size
            else:
                kept.append((used, size, entry))
        total = sum(size for _, size, _ in kept)
        for used, size, entry in kept:
            if max_bytes is None or total <= max_bytes:
                break
            shutil.rmtree(entry, ignore_errors=True)
            removed, freed, total = removed + 1, freed + size, total - size
        tmp = self.root / "tmp"
        if tmp.is_dir():  # leftovers of builds that were killed while storing
            for folder in tmp.iterdir():
                try:
                    if now - folder.stat().st_mtime > 3600:
                        shutil.rmtree(folder, ignore_errors=True)
                except OSError:
                    pass
        return {"removed": removed, "freed_bytes": freed, "kept": len(self.entries()), "bytes": total}


def open_cache() -> Cache | None:
    from .build_state.remote_cache import shared_remote  # light; boto3 only once a remote is set and first used
    root, remote = cache_root(), shared_remote()
    return Cache(root, remote) if root is not None or remote is not None else None


def _copy(source: Path, dest: Path) -> str:
    """Copy a file and return the xxh3_128 of the bytes copied."""
    h = xxhash.xxh3_128()
    with open(source, "rb") as src, open(dest, "wb") as dst:
        while chunk := src.read(_CHUNK):
            h.update(chunk)
            dst.write(chunk)
    return h.hexdigest()


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    text = text.strip().lower().rstrip("b")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def _age(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
    text = text.strip().lower()
    if text and text[-1] in units:
        return float(text[:-1]) * units[text[-1]]
    return float(text) * 86400  # plain number: days


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m build_rules.cache", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", help=f"cache folder (default: ${ENV}, else {DEFAULT})")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="entries and size; the remote tier's state and this repo's hits")
    prune = sub.add_parser("prune", help="drop old entries (by last use)")
    prune.add_argument("--max-size", type=_size, help="keep at most this much, e.g. 5G (least recently used go)")
    prune.add_argument("--older-than", type=_age, help="drop entries unused for this long, e.g. 30d, 12h")
    sub.add_parser("clear", help="drop every entry")
    args = parser.parse_args(argv)
    root = Path(args.dir) if args.dir else cache_root()
    if root is None:
        print(f"the build cache is off ({ENV}={os.environ.get(ENV)})")
        if args.command == "info":
            from .build_state import remote_cache
            print("\n".join(remote_cache.info_lines()))
        return 0
    cache = Cache(root)
    if args.command == "info":
        entries = cache.entries()
        print(f"{root}: {len(entries)} entries, {sum(s for _, s, _ in entries) / 1e6:.1f} MB")
        from .build_state import remote_cache
        print("\n".join(remote_cache.info_lines()))
    elif args.command == "prune":
        if args.max_size is None and args.older_than is None:
            parser.error("prune needs --max-size and/or --older-than")
        result = cache.prune(args.max_size, args.older_than)
        print(f"{root}: removed {result['removed']} entries ({result['freed_bytes'] / 1e6:.1f} MB), "
              f"{result['kept']} left ({result['bytes'] / 1e6:.1f} MB)")
    else:
        shutil.rmtree(root, ignore_errors=True)
        print(f"{root}: cleared")
    return 0


if __name__ == "__main__":
    sys.exit(main())

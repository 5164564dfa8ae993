"""The build cache's shared tier: an S3 bucket (AWS or any S3-compatible store), read through boto3.

    BUILD_RULES_REMOTE_CACHE=s3://<bucket>/<prefix>     on (unset, empty or "off": off)
    BUILD_RULES_REMOTE_CACHE_MODE=readwrite | read      default readwrite; read never writes (developers, PR jobs)
    BUILD_RULES_REMOTE_CACHE_TIMEOUT=5                  seconds to connect and between bytes read (3 tries each)

Endpoint, region and credentials come from the standard AWS variables and files (AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ~/.aws/config; path-style addressing for a store that
needs it: `s3 = addressing_style = path` there). boto3 is imported only when the variable is set.

Layout, as Bazel's remote cache: <prefix>cas/<sha256> holds one file's bytes, uploaded only when absent (HEAD,
then PUT with If-None-Match: *; writers racing for it send the same bytes, and a 412 means one already did);
<prefix>ac/<entry key> is the entry's JSON manifest (format version, targets with sha256 and size, the log's
sha256, the stage's values), uploaded after its objects, so a manifest never names an object not yet there.
Nothing is ever deleted from the bucket: eviction is the bucket's lifecycle rules (docs/ci.md).

The local cache (cache.py) asks here when it misses: the manifest is read, each object streamed to a temp file
beside its target, checked by sha256 and size, and renamed into place once all are good; the local cache then
keeps a copy. A missing or corrupt object is a miss with a warning naming it: the stage runs, and its upload
replaces the bad object. A store that cannot be reached or refuses (network error, timeout, 403, 5xx after the
retries) gets one warning and is left alone for the rest of the process: the build goes on locally.
Hit counts: out/.build-state/remote-cache.json, shown by `python -m build_rules.cache info`.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import xxhash

from .state import REMOTE_CACHE_STATS
from ..configuration.config import ConfigError
from ..plumbing.env_settings import number

ENV = "BUILD_RULES_REMOTE_CACHE"
MODE_ENV = "BUILD_RULES_REMOTE_CACHE_MODE"
TIMEOUT_ENV = "BUILD_RULES_REMOTE_CACHE_TIMEOUT"
MODES = ("read", "readwrite")
FORMAT = 1
STATS = REMOTE_CACHE_STATS  # state.py
# Standard retry mode, 3 attempts in all: a transient 500 or reset passes, a dead store costs seconds.
ATTEMPTS = 3
_CHUNK = 1 << 20
_OFF = ("off", "0", "no", "none", "false")


@dataclass(frozen=True)
class Settings:
    bucket: str
    prefix: str  # "" or ends with "/"
    mode: str
    timeout: float

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


def settings(environ=os.environ) -> Settings | None:
    """The remote tier's settings from the environment, or None when it is off; ConfigError when malformed
    (checked when the build file loads, so a typo never silently turns a read-only job into a writer)."""
    value = environ.get(ENV, "").strip()
    if not value or value.lower() in _OFF:
        return None
    match = re.fullmatch(r"s3://([A-Za-z0-9][A-Za-z0-9._-]{2,254})(?:/(.*))?", value)
    if not match:
        raise ConfigError(f"{ENV}={value!r}: expected s3://<bucket>/<prefix> with a bucket name of 3 or more "
                          "letters, digits, '.', '_' or '-', e.g. s3://team-build-cache/qnn/ (endpoint and "
                          "credentials come from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...)")
    prefix = (match.group(2) or "").strip("/")
    mode = environ.get(MODE_ENV, "readwrite").strip().lower() or "readwrite"
    if mode not in MODES:
        raise ConfigError(f"{MODE_ENV}={mode!r}: expected 'read' (download only: developers, pull-request jobs) "
                          "or 'readwrite' (trusted CI)")
    timeout = float(number(TIMEOUT_ENV, 5, more_than=0, what="a number of seconds > 0", error=ConfigError,
                           environ=environ))
    return Settings(match.group(1), prefix + "/" if prefix else "", mode, timeout)


_remotes: dict[tuple, RemoteCache] = {}
_remotes_lock = threading.Lock()


def shared_remote() -> RemoteCache | None:
    """This process's remote tier (one client and one outage state for all tasks), or None when off."""
    try:
        found = settings()
    except ConfigError as e:
        _warn(f"{e}; building without the remote cache")
        return None
    if found is None:
        return None
    # Tests run several builds in one process, against other servers and repos: one tier per combination.
    key = (found, os.getcwd(), tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_"))))
    with _remotes_lock:
        if key not in _remotes:
            _remotes[key] = RemoteCache(found)
        return _remotes[key]


class _Unusable(Exception):
    """The store failed as a whole (unreachable, refusing, erring): stop using it."""


class _BadObject(Exception):
    """One object or manifest is missing or wrong: a miss, with a warning."""


class RemoteCache:
    def __init__(self, found: Settings, stats_path: str | None = STATS):
        """stats_path None: count nothing and warn about nothing (`cache info`'s own probe)."""
        self.settings = found
        self.url = found.url
        self.stats = Stats(Path(stats_path).resolve() if stats_path else None, self.url)
        self._lock = threading.Lock()
        self._client = None
        self._down: str | None = None  # why the store was given up on
        self._writes_refused = False
        self._conditional_writes = True  # If-None-Match: *; dropped for a store that answers 501
        self._repair: set[str] = set()  # object keys found missing or corrupt: the next upload replaces them

    # --- lookups ---------------------------------------------------------------------------------------

    def restore(self, key: str, targets: list[str], log: str | None = None, relocatable: bool = False):
        """Put entry `key`'s outputs onto targets; return its manifest (with the stage's values), or None."""
        manifest_key = self._object("ac", key)
        temps: list[Path] = []
        try:
            body = self._get_bytes(manifest_key)
            if body is None:
                self.stats.add(misses=1)
                return None
            manifest = self._parse_manifest(manifest_key, body)
            if manifest is None:  # another build_rules' format: its entry, not ours to judge or rewrite
                self.stats.add(misses=1)
                return None
            stored = [f["path"] for f in manifest["targets"]]
            if relocatable:
                if [Path(t).name for t in stored] != [Path(t).name for t in targets]:
                    self.stats.add(misses=1)
                    return None
            elif stored != list(targets):
                self.stats.add(misses=1)
                return None
            digests = []
            for target, stored_file in zip(targets, manifest["targets"]):
                target_path = Path(target)
                target_path.parent.mkdir(parents=True, exist_ok=True)
                tmp = target_path.with_name(f".{target_path.name}.{uuid.uuid4().hex[:8]}.remote")
                temps.append(tmp)
                digests.append(self._download(stored_file, tmp, f"for {target}, entry {manifest_key}"))
            stored_log = b""
            if manifest.get("log"):
                stored_log = self._get_verified_bytes(manifest["log"], f"the log of entry {manifest_key}")
        except _BadObject as e:
            _remove(temps)
            self._mark_for_repair(manifest_key)  # the stage's upload rewrites the entry, whatever bytes it makes
            self.stats.add(corrupt=1)
            _warn(f"remote build cache: {e}; a miss: the stage runs, and its upload replaces the entry")
            return None
        except _Unusable:
            _remove(temps)
            return None
        except OSError as e:  # the local disk (full, read-only): a miss; the stage's own write will say more
            _remove(temps)
            _warn(f"remote build cache: could not write a download beside {e.filename}: {e.strerror}")
            return None
        for tmp, target in zip(temps, targets):
            os.replace(tmp, target)
        from .hashing import stat_cache
        for target, digest in zip(targets, digests):
            stat_cache().remember(target, digest)  # doit stamps the restored targets without reading them again
        if log:
            Path(log).parent.mkdir(parents=True, exist_ok=True)
            Path(log).write_bytes(f"[restored from the remote build cache: {self._url(manifest_key)}]\n".encode()
                                  + stored_log)
        self.stats.add(hits=1, bytes_downloaded=sum(f["size"] for f in manifest["targets"]), last_hit=time.time())
        return manifest

    def _parse_manifest(self, name: str, body: bytes) -> dict | None:
        """The manifest; None if it has another format version; _BadObject if it is not a manifest."""
        try:
            manifest = json.loads(body)
            if manifest.get("format") != FORMAT:
                return None
            for f in manifest["targets"] + ([manifest["log"]] if manifest.get("log") else []):
                if not (isinstance(f["path"], str) and re.fullmatch(r"[0-9a-f]{64}", f["sha256"])
                        and isinstance(f["size"], int)):
                    raise ValueError(f)
            return manifest
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            self._mark_for_repair(name)
            raise _BadObject(f"{self._url(name)} is not a valid manifest ({type(e).__name__})") from None

    def _download(self, stored_file: dict, tmp: Path, purpose: str) -> str:
        """Stream cas/<sha256> into tmp, checking sha256 and size; return the bytes' xxh3_128 (the stat cache's)."""
        name = self._object("cas", stored_file["sha256"])
        body = self._request("get_object", name)
        if body is None:
            self._mark_for_repair(name)
            raise _BadObject(f"{self._url(name)} ({purpose}) is missing")
        sha, xxh, size = hashlib.sha256(), xxhash.xxh3_128(), 0
        chunks = body["Body"].iter_chunks(_CHUNK)
        with open(tmp, "wb") as out:  # an OSError here is the local disk's
            while True:
                try:
                    chunk = next(chunks, b"")
                except Exception as e:  # the connection broke or stalled mid-body
                    self._give_up(f"{type(e).__name__} while reading {name}: {e}")
                    raise _Unusable() from None
                if not chunk:
                    break
                sha.update(chunk)
                xxh.update(chunk)
                size += len(chunk)
                out.write(chunk)
        if sha.hexdigest() != stored_file["sha256"] or size != stored_file["size"]:
            self._mark_for_repair(name)
            raise _BadObject(f"{self._url(name)} ({purpose}) is corrupt: {size} bytes with sha256 "
                             f"{sha.hexdigest()[:16]}..., expected {stored_file['size']} bytes")
        return xxh.hexdigest()

    def _get_verified_bytes(self, stored_file: dict, purpose: str) -> bytes:
        name = self._object("cas", stored_file["sha256"])
        data = self._get_bytes(name)
        if data is None:
            self._mark_for_repair(name)
            raise _BadObject(f"{self._url(name)} ({purpose}) is missing")
        if hashlib.sha256(data).hexdigest() != stored_file["sha256"]:
            self._mark_for_repair(name)
            raise _BadObject(f"{self._url(name)} ({purpose}) is corrupt: sha256 does not match")
        return data

    def _get_bytes(self, name: str) -> bytes | None:
        response = self._request("get_object", name)
        if response is None:
            return None
        try:
            return response["Body"].read()
        except Exception as e:
            self._give_up(f"{type(e).__name__} while reading {name}: {e}")
            raise _Unusable() from None

    # --- uploads ---------------------------------------------------------------------------------------

    def store(self, key: str, targets: list[str], values, log: str | None = None, stage: str = "") -> None:
        """Upload a finished stage's outputs (readwrite mode): objects first, then the manifest naming them."""
        if self.settings.mode != "readwrite" or self._writes_refused:
            return
        try:
            files, uploaded = [], [0, 0, 0]  # objects uploaded, objects already there, bytes uploaded
            for target in targets:
                files.append(self._upload_file(Path(target), uploaded))
            log_file = self._upload_file(Path(log), uploaded) if log and Path(log).is_file() else None
            manifest = {"format": FORMAT, "stage": stage, "targets": files, "log": log_file, "values": values,
                        "created": time.time(), "written_by": socket.gethostname()}
            body = json.dumps(manifest, sort_keys=True).encode()
            wrote = self._put_if_absent(self._object("ac", key), body, len(body))
            self.stats.add(uploads=int(wrote), objects_uploaded=uploaded[0], objects_present=uploaded[1],
                           bytes_uploaded=uploaded[2])
        except (_Unusable, OSError):
            pass  # warned (or a local file vanished): the local cache has the entry all the same

    def _upload_file(self, path: Path, uploaded: list) -> dict:
        sha, size = hashlib.sha256(), 0
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                sha.update(chunk)
                size += len(chunk)
        digest = sha.hexdigest()
        with open(path, "rb") as f:
            if self._put_if_absent(self._object("cas", digest), f, size):
                uploaded[0], uploaded[2] = uploaded[0] + 1, uploaded[2] + size
            else:
                uploaded[1] += 1
        return {"path": str(path), "sha256": digest, "size": size}

    def _put_if_absent(self, name: str, body, size: int) -> bool:
        """HEAD, then PUT only if absent; True if this call wrote it. A key marked for repair is overwritten."""
        with self._lock:
            repair = name in self._repair
        if not repair and self._request("head_object", name) is not None:
            return False
        extra = {"IfNoneMatch": "*"} if self._conditional_writes and not repair else {}
        try:
            self._request("put_object", name, Body=body, ContentLength=size, **extra)
        except _Conditional as e:
            if e.status == 412:
                return False  # another writer won the race with the same bytes (or, for ac/, an equal entry)
            self._conditional_writes = False  # 501: the store has no conditional writes; HEAD guards alone
            if hasattr(body, "seek"):
                body.seek(0)
            self._request("put_object", name, Body=body, ContentLength=size)
        with self._lock:
            self._repair.discard(name)
        return True

    # --- talking to the store --------------------------------------------------------------------------

    def _object(self, kind: str, name: str) -> str:
        return f"{self.settings.prefix}{kind}/{name}"

    def _url(self, name: str) -> str:
        return f"s3://{self.settings.bucket}/{name}"

    def _mark_for_repair(self, name: str) -> None:
        with self._lock:
            self._repair.add(name)

    def client(self):
        """The boto3 client, made (and the bucket probed) on first use; _Unusable once the store failed."""
        with self._lock:
            if self._down is None and self._client is None:
                try:
                    self._client = _make_client(self.settings)
                    self._client.head_bucket(Bucket=self.settings.bucket)
                except Exception as e:
                    self._client = None
                    self._down = _describe(e, f"bucket {self.settings.bucket}")
                    self._announce_down()
            if self._down is not None:
                raise _Unusable()
            return self._client

    def _request(self, operation: str, name: str, **kwargs):
        """One S3 call on key `name`: its response, None for a 404; _Unusable if the store failed as a whole."""
        client = self.client()
        from botocore.exceptions import ClientError
        try:
            return getattr(client, operation)(Bucket=self.settings.bucket, Key=name, **kwargs)
        except ClientError as e:
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = str(e.response.get("Error", {}).get("Code"))
            if status == 404 and code in ("404", "NoSuchKey", "NotFound"):
                return None
            if operation == "put_object" and status in (412, 501) and "IfNoneMatch" in kwargs:
                raise _Conditional(status) from None
            if operation == "put_object" and status == 403:
                with self._lock:
                    first, self._writes_refused = not self._writes_refused, True
                if first:
                    self.stats.add(failures=1, last_failure=f"writes refused: {_describe(e, name)}")
                    _warn(f"remote build cache {self.url}: writes refused ({_describe(e, name)}); this machine "
                          f"only reads from now on (set {MODE_ENV}=read to say so)")
                raise _Unusable() from None
            self._give_up(_describe(e, name))
            raise _Unusable() from None
        except Exception as e:  # network errors, timeouts, retries exhausted
            self._give_up(_describe(e, name))
            raise _Unusable() from None

    def _give_up(self, reason: str) -> None:
        with self._lock:
            if self._down is not None:
                return
            self._down = reason
        self._announce_down()

    def _announce_down(self) -> None:
        if self.stats.path is None:
            return
        self.stats.add(failures=1, last_failure=self._down)
        _warn(f"remote build cache {self.url} is unusable ({self._down}); this build goes on with the local "
              "cache only")

    # --- `python -m build_rules.cache info` -------------------------------------------------------------

    def describe_bucket(self, limit: int = 10_000) -> str:
        """The store's state: reachable or why not; manifests and objects under the prefix (listing capped)."""
        try:
            client = self.client()
        except _Unusable:
            return f"unusable: {self._down}"
        counts = {}
        try:
            for kind in ("ac", "cas"):
                n, size, more = 0, 0, False
                for page in client.get_paginator("list_objects_v2").paginate(
                        Bucket=self.settings.bucket, Prefix=self._object(kind, ""), PaginationConfig={"PageSize": 1000}):
                    for item in page.get("Contents", []):
                        n, size = n + 1, size + item["Size"]
                    if n >= limit:
                        more = True
                        break
                counts[kind] = (f"{n}{'+' if more else ''}", size)
        except Exception as e:
            return f"unusable: {_describe(e, 'listing')}"
        return (f"reachable, {counts['ac'][0]} manifests, {counts['cas'][0]} objects "
                f"({counts['cas'][1] / 1e6:.1f} MB)")


class _Conditional(Exception):
    def __init__(self, status: int):
        self.status = status


def _make_client(found: Settings):
    try:
        import boto3
    except ModuleNotFoundError:
        raise ModuleNotFoundError(f"{ENV} is set but boto3 is not installed: pip install 'build_rules[remote-cache]'"
                                  " (or pip install 'boto3>=1.36')") from None
    from botocore.config import Config
    session = boto3.session.Session()
    config = Config(connect_timeout=found.timeout, read_timeout=found.timeout,
                    retries={"total_max_attempts": ATTEMPTS, "mode": "standard"},
                    # boto3 >= 1.36 sends CRC32 checksums by default, which many S3-compatible stores
                    # refuse; integrity is checked here, by sha256, anyway.
                    request_checksum_calculation="when_required", response_checksum_validation="when_required")
    return session.client("s3", region_name=session.region_name or "us-east-1", config=config)


def _describe(error: Exception, what: str) -> str:
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = response.get("Error", {}).get("Code")
        return f"HTTP {status} {code} on {what}"
    return f"{type(error).__name__}: {error}"


def _warn(text: str) -> None:
    # doit captures a task's sys.stderr (verbosity 0): the warning goes to the process's own stderr.
    stream = sys.__stderr__ or sys.stderr
    print(f"warning: {text}", file=stream, flush=True)


def _remove(paths) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


class Stats:
    """Counters of one repo's use of each remote, in one small JSON file (locked: -P thread and several doits)."""

    COUNTERS = ("hits", "misses", "corrupt", "uploads", "objects_uploaded", "objects_present",
                "bytes_downloaded", "bytes_uploaded", "failures")

    def __init__(self, path: Path | None, url: str):
        self.path = path
        self.url = url

    def add(self, **counts) -> None:
        if self.path is None:
            return
        try:
            import fcntl
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a+", encoding="utf-8") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                f.seek(0)
                try:
                    data = json.loads(f.read() or "{}")
                except ValueError:
                    data = {}  # torn by a kill: counting starts again
                mine = data.setdefault(self.url, {})
                for name, value in counts.items():
                    mine[name] = mine.get(name, 0) + value if name in self.COUNTERS else value
                if "last_failure" in counts:
                    mine["last_failure_at"] = time.time()
                f.seek(0)
                f.truncate()
                f.write(json.dumps(data, indent=1, sort_keys=True))
        except (OSError, ImportError):
            pass  # counts are for people; never a reason to fail a build

    def read(self) -> dict:
        if self.path is None:
            return {}
        try:
            return json.loads(self.path.read_text(encoding="utf-8")).get(self.url, {})
        except (OSError, ValueError):
            return {}


def info_lines() -> list[str]:
    """For `python -m build_rules.cache info` (run in the repo: the hit counts are its out/.build-state)."""
    try:
        found = settings()
    except ConfigError as e:
        return [f"remote: {e}"]
    if found is None:
        return [f"remote: off ({ENV} is not set)"]
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "AWS default"
    lines = [f"remote: {found.url} ({found.mode}, endpoint {endpoint}): "
             f"{RemoteCache(found, stats_path=None).describe_bucket()}"]
    stats = Stats(Path(STATS).resolve(), found.url)
    s = stats.read()
    if not s:
        lines.append(f"  no use recorded in {stats.path}")
        return lines
    lookups = s.get("hits", 0) + s.get("misses", 0) + s.get("corrupt", 0)
    rate = f" ({100 * s.get('hits', 0) / lookups:.0f} % of {lookups} lookups)" if lookups else ""
    lines.append(f"  this repo: {s.get('hits', 0)} hits{rate}, {s.get('misses', 0)} misses, "
                 f"{s.get('corrupt', 0)} missing or corrupt objects, {s.get('bytes_downloaded', 0) / 1e6:.1f} MB "
                 f"downloaded; {s.get('uploads', 0)} entries uploaded ({s.get('objects_uploaded', 0)} objects, "
                 f"{s.get('bytes_uploaded', 0) / 1e6:.1f} MB; {s.get('objects_present', 0)} already there)")
    if s.get("failures"):
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.get("last_failure_at", 0)))
        lines.append(f"  {s['failures']} failures, last at {when}: {s.get('last_failure')}")
    return lines

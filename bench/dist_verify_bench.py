"""Benchmark (not a test): `python -m build_rules.dist verify` standalone against the dist stage on one bundle.

    python bench/dist_verify_bench.py REPO [--model mtcnn] [--variant w8a8]

REPO is a model repo where `doit dist:<model>/<variant>` has run (e.g. a copy of this repo after
`doit dist:mtcnn/w8a8`). Times, one after the other: the standalone verify with its default sample count, with
`--samples all` (what the default was before issue 18), with `--samples 0`, and the dist stage forced to run again
(`doit forget`, build cache off). Prints a Markdown table with the load average before each row: on a shared
machine compare the ratios of rows measured close together.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path


def timed(cmd: list[str], cwd: Path, env: dict) -> float:
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("repo", type=Path)
    parser.add_argument("--model", default="mtcnn")
    parser.add_argument("--variant", default="w8a8")
    args = parser.parse_args()
    env = dict(os.environ)
    bundle = f"out/{args.model}/dist/{args.variant}"
    task = f"dist:{args.model}/{args.variant}"
    verify = [sys.executable, "-m", "build_rules.dist", "verify", bundle]
    rows = [("`dist verify` (default samples)", verify), ("`dist verify --samples all`", verify + ["--samples", "all"]),
            ("`dist verify --samples 0`", verify + ["--samples", "0"])]
    print(f"| {args.model} {args.variant} bundle | seconds | load average before |\n|---|---|---|")
    for name, cmd in rows:
        load = os.getloadavg()[0]
        print(f"| {name} | {timed(cmd, args.repo, env):.1f} | {load:.1f} |", flush=True)
    timed([sys.executable, "-m", "doit", "forget", task], args.repo, env)
    load = os.getloadavg()[0]
    seconds = timed([sys.executable, "-m", "doit", task], args.repo, dict(env, BUILD_RULES_CACHE="off"))
    print(f"| `doit {task}` (forced, cache off) | {seconds:.1f} | {load:.1f} |")


if __name__ == "__main__":
    main()

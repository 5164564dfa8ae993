"""Issue 36's measurements (not a test): a one-variant edit and a build from scratch, serial against parallel, in
turns on the same machine. Prints Markdown tables (docs/benchmarks.md, "Verdicts at the speed of the machine").

    python bench/verdict_speed.py edit REPO [--rounds 2] [--samples 6]
        REPO: a built Whisper tiny.en repo (bench/build_bench.make_repo + `doit`). Each run is one variant edit, the
        w8a16 calibration samples 8 -> N or back N -> 8 (both the same work: calibrate, quantize, compile, check and
        evaluate of one variant; a build whose gate fails stops at that check, as a user's `doit` does, and the row
        says so), with the build cache off (a flip back would be a restore) and the emulator output
        memo emptied first (no run reads another run's outputs). The modes:
          serial        BUILD_RULES_EMULATOR_WORKERS=1, memo off, `doit -n 1`: one session, samples in order
          workers       2 emulator workers, memo off, `doit -n 1`
          workers+memo  2 workers and the output memo (the default), `doit -n 1`
          default -n 2  the defaults and `doit -n 2 -P thread` (the README's command)
    python bench/verdict_speed.py scratch REPO --before CHECKOUT [--rounds 2]
        REPO: a model repo (e.g. five-chip MTCNN); each run deletes out/ and builds everything with
        `doit -n 2 -P thread` and the build cache off, once with CHECKOUT's build_rules (the code before issue 36)
        and once with this one's, in turns.

Every run's wall time, its tasks, the seconds per stage and the emulator sessions' seconds (the build log's fifth
column; this checkout only) are printed to stderr as they come, so a run that dies still leaves numbers.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOIT = shutil.which("doit") or "doit"

EDIT_MODES = {
    "serial": ({"BUILD_RULES_EMULATOR_WORKERS": "1", "BUILD_RULES_EMULATOR_MEMO_MB": "0"}, ["-n", "1"]),
    "workers": ({"BUILD_RULES_EMULATOR_WORKERS": "2", "BUILD_RULES_EMULATOR_MEMO_MB": "0"}, ["-n", "1"]),
    "workers+memo": ({"BUILD_RULES_EMULATOR_WORKERS": "2"}, ["-n", "1"]),
    "default -n 2": ({}, ["-n", "2", "-P", "thread"]),
}


def run_build(repo: Path, code: Path, env_extra: dict, args: list[str]) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUILD_RULES_")}
    env.update(env_extra, BUILD_RULES_CACHE="off",
               PYTHONPATH=os.pathsep.join(p for p in (str(code), os.environ.get("PYTHONPATH")) if p))
    load = os.getloadavg()[0]
    started = time.perf_counter()
    done = subprocess.run([DOIT, *args], cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    wall = time.perf_counter() - started
    failed = re.findall(r"^(\S+): gate failed.*$", done.stdout, re.M)
    if done.returncode != 0 and not failed:
        sys.exit(f"doit {' '.join(args)} failed in {repo}:\n{done.stdout[-4000:]}")
    stages, emulator = defaultdict(float), 0.0
    log = (repo / "out/.build-state/build.log").read_text().splitlines()
    last = max(i for i, line in enumerate(log) if line.startswith("#"))
    for line in log[last + 1:]:
        parts = line.split("\t")
        stages[parts[3].split(":", 1)[0]] += float(parts[1])
        emulator += float(parts[4]) if len(parts) > 4 else 0.0
    return {"wall": wall, "tasks": len(re.findall(r"^\.  ", done.stdout, re.M)), "stages": dict(stages),
            "emulator": emulator, "load": (load, os.getloadavg()[0]),
            "failed": re.findall(r"^(\S+): gate failed (after \d+ of \d+ samples)?", done.stdout, re.M)}


def say(mode: str, result: dict) -> None:
    stages = ", ".join(f"{s} {t:.0f}" for s, t in sorted(result["stages"].items(), key=lambda kv: -kv[1]))
    print(f"  {mode}: {result['wall']:.1f} s, {result['tasks']} tasks, emulator sessions {result['emulator']:.0f} s, "
          f"load {result['load'][0]:.2f} -> {result['load'][1]:.2f}; {stages}; failed: {result['failed']}",
          file=sys.stderr, flush=True)


def edit(repo: Path, rounds: int, samples: int) -> None:
    toml = repo / "models/whisper_tiny_en/model.toml"
    runs = defaultdict(list)
    for _ in range(rounds):
        for mode, (env_extra, args) in EDIT_MODES.items():
            text = toml.read_text()
            now = int(re.search(r'(\[variants\.w8a16\][^\[]*?samples = )(\d+)', text).group(2))
            toml.write_text(re.sub(r'(\[variants\.w8a16\][^\[]*?samples = )(\d+)',
                                   lambda m: m.group(1) + str(samples if now == 8 else 8), text, count=1))
            shutil.rmtree(repo / "out/.build-state/emulator-outputs", ignore_errors=True)
            runs[mode].append(run_build(repo, ROOT, env_extra, args))
            say(f"{mode} (samples {now} -> {samples if now == 8 else 8})", runs[mode][-1])
    serial = statistics.median(r["wall"] for r in runs["serial"])
    print("| mode | wall, median (every run) | / serial | tasks | emulator sessions' seconds | check s | evaluate s "
          "| gate failed | load (1 min) |\n|---|---|---|---|---|---|---|---|---|")
    for mode, results in runs.items():
        wall = statistics.median(r["wall"] for r in results)
        every = ", ".join(f"{r['wall']:.0f}" for r in results)
        print(f"| {mode} | {wall:.0f} s ({every}) | {wall / serial:.2f} | {results[0]['tasks']} | "
              f"{statistics.median(r['emulator'] for r in results):.0f} | "
              f"{statistics.median(r['stages'].get('check', 0) for r in results):.0f} | "
              f"{statistics.median(r['stages'].get('evaluate', 0) for r in results):.0f} | "
              f"{'; '.join(sorted({' '.join(f) for r in results for f in r['failed']})) or '-'} | "
              f"{min(r['load'][0] for r in results):.2f}-{max(r['load'][1] for r in results):.2f} |")


def scratch(repo: Path, before: Path, rounds: int) -> None:
    runs = defaultdict(list)
    for _ in range(rounds):
        for side, code in (("before", before), ("after", ROOT)):
            shutil.rmtree(repo / "out", ignore_errors=True)
            runs[side].append(run_build(repo, code, {}, ["-n", "2", "-P", "thread"]))
            say(side, runs[side][-1])
    print("| code | wall, median (every run) | tasks | check s | evaluate s | compile s | load (1 min) |\n"
          "|---|---|---|---|---|---|---|")
    for side, results in runs.items():
        every = ", ".join(f"{r['wall']:.0f}" for r in results)
        print(f"| {side} | {statistics.median(r['wall'] for r in results):.0f} s ({every}) | {results[0]['tasks']} | "
              + " | ".join(f"{statistics.median(r['stages'].get(s, 0) for r in results):.0f}"
                           for s in ("check", "evaluate", "compile"))
              + f" | {min(r['load'][0] for r in results):.2f}-{max(r['load'][1] for r in results):.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("edit", "scratch"))
    parser.add_argument("repo", type=Path)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--samples", type=int, default=6, help="edit: the calibration samples toggled with 8")
    parser.add_argument("--before", type=Path, help="scratch: a checkout of the code before issue 36")
    args = parser.parse_args()
    if args.what == "edit":
        edit(args.repo.resolve(), args.rounds, args.samples)
    else:
        scratch(args.repo.resolve(), args.before.resolve(), args.rounds)


if __name__ == "__main__":
    main()

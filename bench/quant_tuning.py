"""Benchmark of the quantization-tuning loop on MTCNN (not a test): prints a Markdown table.

    python bench/quant_tuning.py [--chips SM8550,SM8650,SM8750,SM8850,QCS9100] [--jobs 2] [--keep DIR]

In a fresh copy of the repo (models/mtcnn, chips.toml, dodo.py) with its own build cache, it times with the real
`doit -n <jobs> -P thread` command:
1. the full build (export -> ... -> package, every variant and chip);
2. the re-run after one weight-bit change (w8a8: weights uint8 -> int8): quantize (no calibration pass), compile,
   check and package of that variant only;
3. the flip back (int8 -> uint8): every stale output comes from the build cache, no stage process starts;
4. `doit report` after that (the variants x chips table from the existing cells).
Each time is also given as a ratio to the full build.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CHIPS = "SM8550,SM8650,SM8750,SM8850,QCS9100"


def doit(repo: Path, *args: str) -> tuple[float, str]:
    env = dict(os.environ)
    env.pop("BUILD_RULES_CACHE", None)  # the copy's own out/.cache
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "doit", *args], cwd=repo, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"doit {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    summary = next((line for line in proc.stdout.splitlines() if line.startswith("summary:")), "")
    return seconds, summary


def set_w8a8_weights(repo: Path, weights: str) -> None:
    toml = repo / "models/mtcnn/model.toml"
    text = toml.read_text()
    start = text.index("[variants.w8a8]")
    section = re.sub(r'weights = "\w+"', f'weights = "{weights}"', text[start:], count=1)
    toml.write_text(text[:start] + section)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chips", default=DEFAULT_CHIPS, help=f"comma-separated (default {DEFAULT_CHIPS})")
    parser.add_argument("--jobs", default="2")
    parser.add_argument("--keep", help="build in this folder and keep it (default: a temp folder, removed)")
    args = parser.parse_args()
    chips = [c for c in args.chips.split(",") if c]
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-quant-tuning-"))
    repo = work / "repo"
    if repo.exists():
        shutil.rmtree(repo)
    (repo / "models").mkdir(parents=True)
    shutil.copy(ROOT / "dodo.py", repo / "dodo.py")
    shutil.copy(ROOT / "chips.toml", repo / "chips.toml")
    shutil.copytree(ROOT / "models/mtcnn", repo / "models/mtcnn")
    toml = repo / "models/mtcnn/model.toml"
    toml.write_text(toml.read_text().replace('hooks = "export.py"', f'hooks = "export.py"\nchips = {chips!r}'.replace(
        "'", '"'), 1))
    parallel = ("-n", args.jobs, "-P", "thread")
    try:
        rows = []
        full, summary = doit(repo, *parallel)
        rows.append(("full build", full, summary))
        set_w8a8_weights(repo, "int8")
        seconds, summary = doit(repo, *parallel)
        rows.append(("re-run after one weight-bit change (w8a8 weights uint8 -> int8)", seconds, summary))
        set_w8a8_weights(repo, "uint8")
        seconds, summary = doit(repo, *parallel)
        rows.append(("flip back (int8 -> uint8), from the build cache", seconds, summary))
        seconds, summary = doit(repo, "report")
        rows.append(("`doit report` afterwards (variants x chips table)", seconds, summary))
        print(f"MTCNN (3 graphs x 3 variants x {len(chips)} chip(s): {', '.join(chips)}), "
              f"`doit -n {args.jobs} -P thread`, {os.cpu_count()} CPUs\n")
        print("| step | seconds | ratio to full build | doit summary |")
        print("|---|---|---|---|")
        for name, seconds, summary in rows:
            print(f"| {name} | {seconds:.1f} | {seconds / full:.3f} | {summary.removeprefix('summary: ')} |")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Issue 36 item 7's scaling table "on paper" (not a test): how a measured build would run on 8, 32 and 128 cores.

    python bench/scaling_table.py BUILD_LOG --build K --samples PREFIX=N [PREFIX=N ...] [--start 1.0] [--cores 2,8,32,128]

BUILD_LOG is out/.build-state/build.log of a build made with one emulator session (BUILD_RULES_EMULATOR_WORKERS=1,
the output memo off, `doit -n 1`), whose task lines carry their emulator sessions' seconds (the fifth column).
--build K: the K-th build in the log (1 = first; negative counts from the end). --samples: how many samples each
emulator task runs (the first matching task-name prefix wins), e.g. check:whisper_tiny_en/encoder=4.

For each task: s = wall - emulator seconds (its serial part: process start, imports, reading inputs, judging,
writing), p = emulator seconds / samples (per sample, the one session's load spread over them). On N cores (N
emulator slots, the default) a task of n samples takes s + start + ceil(n / min(N, n)) * p, where start is a worker's
start-up when it splits (--start, seconds). The table sums the tasks as `doit -n 1` runs them, and gives the bound no
number of cores removes: every serial part plus the slowest single sample of each task.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path


def builds(log: Path) -> list[list[tuple[float, str, float]]]:
    """[(wall, task, emulator seconds)] per build in the log."""
    out: list[list] = []
    for line in log.read_text().splitlines():
        if line.startswith("#"):
            out.append([])
            continue
        parts = line.split("\t")
        if len(parts) >= 4 and out:
            out[-1].append((float(parts[1]), parts[3], float(parts[4]) if len(parts) > 4 else 0.0))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--build", type=int, default=-1)
    parser.add_argument("--samples", nargs="+", default=[])
    parser.add_argument("--start", type=float, default=1.0)
    parser.add_argument("--cores", default="2,8,32,128")
    args = parser.parse_args()
    rows = builds(args.log)[args.build - 1 if args.build > 0 else args.build]
    counts = [(p.rsplit("=", 1)[0], int(p.rsplit("=", 1)[1])) for p in args.samples]
    cores = [int(c) for c in args.cores.split(",")]

    def samples(task: str) -> int:
        return next((n for prefix, n in counts if task.startswith(prefix)), 1)

    def on(task_wall: float, emulator: float, n: int, k: int) -> float:
        if not emulator:
            return task_wall
        serial, per_sample = task_wall - emulator, emulator / n
        split = min(k, n)
        return serial + (args.start if split > 1 else 0.0) + math.ceil(n / split) * per_sample

    print("| task | samples | serial part s | per sample s | " + " | ".join(f"{c} cores" for c in cores) + " |")
    print("|---|---|---|---|" + "---|" * len(cores))
    totals = [0.0] * len(cores)
    floor = 0.0
    for wall, task, emulator in rows:
        n = samples(task)
        times = [on(wall, emulator, n, c) for c in cores]
        totals = [t + x for t, x in zip(totals, times)]
        floor += (wall - emulator + emulator / n) if emulator else wall
        if emulator:
            print(f"| {task} | {n} | {wall - emulator:.1f} | {emulator / n:.1f} | "
                  + " | ".join(f"{x:.0f}" for x in times) + " |")
    rest = sum(wall for wall, _, emulator in rows if not emulator)
    print(f"| the {sum(1 for *_, e in rows if not e)} tasks without the emulator | | {rest:.0f} | | "
          + " | ".join(f"{rest:.0f}" for _ in cores) + " |")
    print(f"| **all, as `doit -n 1` runs them** | | | | " + " | ".join(f"**{t:.0f}**" for t in totals) + " |")
    print(f"\nBound at any number of cores (serial parts + each task's slowest sample): {floor:.0f} s.")


if __name__ == "__main__":
    main()

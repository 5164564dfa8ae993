"""Where a test run's build time went, by stage: every out/.build-state/build.log under a pytest base folder.

    python bench/suite_stage_seconds.py /tmp/pytest-of-$USER/pytest-<n> [--graphs export]

Prints a table of tasks and seconds per stage and per how each ended (ran, restored from the build cache, failed);
with --graphs STAGE, that stage's seconds per model/graph. Tests copy built repos, logs and all: a line seen in
several logs (the same start time and task) counts once. test_progress writes made-up lines into some logs (the
time-left estimates it checks); they count too, so a stage's largest numbers can be made up.
"""
from __future__ import annotations

import argparse
import collections
from pathlib import Path


def read_lines(base: Path):
    """(seconds, how, task) of every task line of every build log under `base`, once."""
    from build_rules.build_log import read_build_log
    seen = set()
    for log in base.rglob("out/.build-state/build.log"):
        for start, seconds, how, task in read_build_log(str(log)):
            if (start, task) not in seen:
                seen.add((start, task))
                yield seconds, how, task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path, help="a pytest base folder (/tmp/pytest-of-<user>/pytest-<n>)")
    parser.add_argument("--graphs", metavar="STAGE", help="that stage's seconds per model/graph")
    args = parser.parse_args()
    per_stage = collections.defaultdict(lambda: [0, 0.0])
    per_graph = collections.defaultdict(lambda: [0, 0.0])
    for seconds, how, task in read_lines(args.base):
        stage, _, name = task.partition(":")
        per_stage[(stage, how)][0] += 1
        per_stage[(stage, how)][1] += seconds
        if stage == args.graphs and how == "ran":
            graph = "/".join(name.split("@")[0].split("/")[:2])
            per_graph[graph][0] += 1
            per_graph[graph][1] += seconds
    total = sum(s for _, s in per_stage.values())
    print(f"| stage | ended | tasks | seconds |  (all: {total:.0f} s)")
    print("|---|---|---:|---:|")
    for (stage, how), (count, seconds) in sorted(per_stage.items(), key=lambda item: -item[1][1]):
        print(f"| {stage} | {how} | {count} | {seconds:.1f} |")
    if args.graphs:
        print(f"\n| {args.graphs}: model/graph | runs | seconds |\n|---|---:|---:|")
        for graph, (count, seconds) in sorted(per_graph.items(), key=lambda item: -item[1][1]):
            print(f"| {graph} | {count} | {seconds:.1f} |")


if __name__ == "__main__":
    main()

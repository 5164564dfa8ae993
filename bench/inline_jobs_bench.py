"""What running small emulator jobs in the stage process saves (build_rules/emulator/emulator_runs.py, the probe) on a
build from scratch: prints a Markdown table.

    python bench/inline_jobs_bench.py [--runs 3] [--model tinynet|mtcnn] [--jobs 2]

Builds the model from scratch (`doit -n <jobs>`, no build cache) in a scratch repo, alternating every job on the
emulator workers (BUILD_RULES_EMULATOR_INLINE_SECONDS=0, as before the probe) and the default, --runs times each;
prints the wall time and the machine's busy CPU seconds of each build (from /proc/stat: run it on an idle machine,
since the stage processes and their workers are children of the fork server, not of doit, so doit's rusage misses
them), their medians, and whether both ways wrote the same bytes (fork_server_bench.outputs).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fork_server_bench import ROOT, make_repo, outputs  # noqa: E402


def busy_seconds() -> float:
    """CPU seconds the whole machine has been busy since boot (user, nice, system, irq, softirq)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:8]
    user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields)
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def build(repo: Path, jobs: int, inline: bool) -> tuple[float, float]:
    shutil.rmtree(repo / "out", ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    env.pop("BUILD_RULES_CACHE", None)
    env.pop("BUILD_RULES_EMULATOR_INLINE_SECONDS", None)
    if not inline:
        env["BUILD_RULES_EMULATOR_INLINE_SECONDS"] = "0"
    cpu, start = busy_seconds(), time.perf_counter()
    done = subprocess.run([shutil.which("doit") or "doit", "-n", str(jobs)], cwd=repo, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    time.sleep(0.5)  # (what the fork server's last children do after doit returns counts too; idle time does not)
    if done.returncode != 0:
        raise SystemExit(f"doit failed in {repo}:\n{done.stdout.decode(errors='replace')[-3000:]}")
    return seconds, busy_seconds() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--model", default="tinynet", choices=("tinynet", "mtcnn"))
    parser.add_argument("--jobs", type=int, default=2, help="doit -n")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="inline-jobs-bench-") as tmp:
        repo = make_repo(Path(tmp) / "repo", args.model)
        runs = {False: [], True: []}
        kept = {}
        for _ in range(args.runs):
            for inline in (False, True):
                runs[inline].append(build(repo, args.jobs, inline))
                kept[inline] = outputs(repo)
        differ = sorted(k for k in kept[False].keys() | kept[True].keys() if kept[False].get(k) != kept[True].get(k))
    print(f"| {args.model} from scratch, `doit -n {args.jobs}` | wall (s) | median | busy CPU (s) | median |")
    print("|---|---|---:|---|---:|")
    base = None
    for inline, name in ((False, "every job on the workers (INLINE_SECONDS=0)"), (True, "small jobs in the stage")):
        wall = [w for w, _ in runs[inline]]
        cpu = [c for _, c in runs[inline]]
        medians = statistics.median(wall), statistics.median(cpu)
        change = "" if base is None else f" ({(medians[0] - base[0]) / base[0]:+.0%})"
        change_cpu = "" if base is None else f" ({(medians[1] - base[1]) / base[1]:+.0%})"
        print(f"| {name} | {', '.join(f'{w:.1f}' for w in wall)} | {medians[0]:.1f}{change} | "
              f"{', '.join(f'{c:.1f}' for c in cpu)} | {medians[1]:.1f}{change_cpu} |")
        base = base or medians
    print(f"\n{len(kept[True])} outputs, {'the same bytes both ways' if not differ else 'DIFFER: ' + ', '.join(differ)}")


if __name__ == "__main__":
    main()

"""Benchmark (not a test): emulator jobs on a local Ray cluster against local worker processes on the same cores.

    python bench/ray_overhead.py REPO [--rounds 5]

REPO is a model repo where `doit verify:mtcnn/pnet verify:mtcnn/rnet compile:mtcnn/pnet/fp16@SM8750
compile:mtcnn/rnet/fp16@SM8750` has run. The jobs are those binaries' checks: each graph's evaluation samples
(P-Net 4 images of 120x160, R-Net 200 crops of 24x24) through build_rules.emulator.emulator_runs.run_outputs, the door the
check stage uses. Each job runs in a fresh process, as a stage does, and is timed from the call to the outputs in
hand (imports of ray / onnxruntime, connecting, worker start and loading the binary included; the interpreter's
start is not):
  serial  one emulator session in the process (BUILD_RULES_EMULATOR_WORKERS=1)
  local   the tool's local worker pool (BUILD_RULES_EMULATOR_WORKERS=2: 2 worker processes, each pinned to a core,
          loads the binary once and takes samples as it frees up)
  ray     BUILD_RULES_RAY_ADDRESS = a cluster started here by tests/ray_cluster.py: a head node and a second node,
          1 CPU each, on this machine (build_rules/emulator/emulator_ray.py: 2 chunks, 2 Ray tasks)
The emulator output memo is off in every run (BUILD_RULES_EMULATOR_MEMO_MB=0): each run measures the emulator.
Rounds interleave the modes (serial local ray serial local ray ...) so a change in the machine's load hits all
three alike; the table gives medians, every run, and the 1-minute load average before each run. The outputs of
every run are compared with the serial run's, byte for byte.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JOBS = [("P-Net fp16 check", "pnet"), ("R-Net fp16 check", "rnet")]
MODES = ("serial", "local", "ray")


def _digest(outputs: list[dict]) -> str:
    h = hashlib.sha256()
    for sample in outputs:
        for name in sorted(sample):
            h.update(name.encode() + str(sample[name].dtype).encode() + str(sample[name].shape).encode())
            h.update(sample[name].tobytes())
    return h.hexdigest()


def one_job(mode: str, ctx: str, evaluation: str) -> None:
    """In the child process: run the job once, print {"seconds", "digest"}."""
    from build_rules.measuring.samples import load_evaluation
    inputs, _ = load_evaluation(evaluation)
    started = time.perf_counter()
    from build_rules.emulator import emulator_runs
    outputs = emulator_runs.run_outputs(ctx, inputs)
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "digest": _digest(outputs), "samples": len(inputs)}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("repo", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--one", nargs=3, metavar=("MODE", "CTX", "EVALUATION"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        return one_job(*args.one)

    sys.path.insert(0, str(ROOT / "tests"))
    from ray_cluster import LocalCluster
    cluster = LocalCluster()
    try:
        cluster.add_node()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
        runs = {(graph, mode): [] for _, graph in JOBS for mode in MODES}
        loads = {(graph, mode): [] for _, graph in JOBS for mode in MODES}
        digests, samples = {}, {}
        for _ in range(args.rounds):
            for _, graph in JOBS:
                ctx = args.repo / f"out/mtcnn/fp16/SM8750/{graph}_ctx.onnx"
                evaluation = args.repo / f"out/mtcnn/float/{graph}.evaluation.npz"
                for mode in MODES:
                    loads[graph, mode].append(os.getloadavg()[0])
                    child_env = dict(env, BUILD_RULES_RAY_ADDRESS=cluster.address if mode == "ray" else "off",
                                     BUILD_RULES_EMULATOR_WORKERS="1" if mode == "serial" else "2",
                                     BUILD_RULES_EMULATOR_MEMO_MB="0")
                    done = subprocess.run([sys.executable, __file__, "x", "--one", mode, str(ctx), str(evaluation)],
                                          env=child_env, capture_output=True, text=True)
                    if done.returncode != 0:
                        sys.exit(f"{mode} {graph} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
                    result = json.loads(done.stdout.strip().splitlines()[-1])
                    runs[graph, mode].append(result["seconds"])
                    samples[graph] = result["samples"]
                    if digests.setdefault(graph, result["digest"]) != result["digest"]:
                        sys.exit(f"{mode} {graph}: outputs differ from the serial run's")
                    print(f"  {graph} {mode}: {result['seconds']:.2f} s (load {loads[graph, mode][-1]:.1f})",
                          file=sys.stderr, flush=True)
    finally:
        cluster.stop()

    print(f"| job (samples) | serial, 1 session | local, 2 workers | Ray, 2 nodes x 1 CPU | Ray / local (medians) | "
          f"Ray / local (median of each round's) | load average (1 min) |\n|---|---|---|---|---|---|---|")
    for label, graph in JOBS:
        median = {mode: statistics.median(runs[graph, mode]) for mode in MODES}
        every = {mode: ", ".join(f"{s:.1f}" for s in runs[graph, mode]) for mode in MODES}
        all_loads = [x for mode in MODES for x in loads[graph, mode]]
        print(f"| {label} ({samples[graph]}) | {median['serial']:.2f} s ({every['serial']}) | {median['local']:.2f} s "
              f"({every['local']}) | {median['ray']:.2f} s ({every['ray']}) | {median['ray'] / median['local']:.2f} | "
              f"{statistics.median(r / loc for r, loc in zip(runs[graph, 'ray'], runs[graph, 'local'])):.2f} | "
              f"{statistics.median(all_loads):.1f} ({min(all_loads):.1f}-{max(all_loads):.1f}) |")
    print(f"\n{args.rounds} rounds, interleaved; medians, every run in brackets; outputs identical in every run.")


if __name__ == "__main__":
    main()

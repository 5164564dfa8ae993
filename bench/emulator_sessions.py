"""How should emulator runs use the cores? One session on 1 or 2 cores against two pinned sessions (not a test).

    python bench/emulator_sessions.py CTX_MODEL [N]

CTX_MODEL: a compiled EPContext model, e.g. out/mtcnn/fp16/SM8750/pnet_ctx.onnx (`doit compile:mtcnn/pnet/fp16@SM8750`).
N runs (default 60) of one input, in fresh processes so start-up (session load) is counted:
- one session pinned to core 0 (taskset -c 0), N runs;
- one session on cores 0-1, N runs;
- two sessions side by side, one pinned to each core, N/2 runs each;
- one session on cores 0-1 with each option below that might limit QNN's threads (N runs each).
Prints a markdown table: wall time (start-up included), ms per run (runs only), CPU seconds (user+sys of the
processes), cores busy (CPU / wall) and the session's thread count after its first run.
Result: docs/benchmarks.md, "Emulator sessions and cores (issue 36)".
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# options that might limit the emulator's threads: onnxruntime's own thread pools, and the QNN EP's knobs that
# its provider library lists (strings libonnxruntime_providers_qnn.so); none names the HVX thread count
OPTIONS = {
    "intra_op_num_threads=1, inter_op_num_threads=1": ({"intra_op_num_threads": 1, "inter_op_num_threads": 1}, {}),
    "htp_performance_mode=power_saver": ({}, {"htp_performance_mode": "power_saver"}),
    "htp_performance_mode=burst": ({}, {"htp_performance_mode": "burst"}),
    "qnn_context_priority=low": ({}, {"qnn_context_priority": "low"}),
}


def child(ctx_model: str, runs: int, session_options: dict, provider_options: dict) -> None:
    """One session, `runs` runs; prints one JSON line (seconds to load, seconds of the runs, threads)."""
    sys.path.insert(0, str(ROOT))
    import numpy as np

    from build_rules.toolchains import ort_qnn
    started = time.perf_counter()
    ort = ort_qnn._ort()
    so = ort_qnn._qnn_session_options(ort, {"backend_type": "htp", **provider_options})
    for key, value in session_options.items():
        setattr(so, key, value)
    session = ort.InferenceSession(ctx_model, sess_options=so)
    session.disable_fallback()
    feed = {i.name: np.random.default_rng(0).standard_normal([d if isinstance(d, int) else 1 for d in i.shape])
            .astype(np.float32) for i in session.get_inputs()}
    session.run(None, feed)
    loaded = time.perf_counter()
    threads = len(os.listdir("/proc/self/task"))
    for _ in range(runs - 1):
        session.run(None, feed)
    done = time.perf_counter()
    print(json.dumps({"load": loaded - started, "runs": done - loaded, "threads": threads}))


def measure(ctx_model: str, jobs: list[tuple[str, int]], options: tuple[dict, dict] = ({}, {})) -> dict:
    """Start one child per (cores, runs) job at once; wall time until all end, their CPU time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    procs = [subprocess.Popen(["taskset", "-c", cores, sys.executable, __file__, "--child", ctx_model, str(runs),
                               json.dumps(options[0]), json.dumps(options[1])], stdout=subprocess.PIPE, text=True)
             for cores, runs in jobs]
    replies = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    per_run = max(r["runs"] / (runs - 1) for r, (_, runs) in zip(replies, jobs)) * 1000
    return {"wall": wall, "cpu": cpu, "per_run_ms": per_run, "threads": replies[0]["threads"],
            "load": max(r["load"] for r in replies)}


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4]), json.loads(sys.argv[5]))
        return 0
    ctx_model = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 60
    print(f"load before: {os.getloadavg()[0]:.2f}")
    print("| runs | wall s (with start-up) | ms/run | CPU s | cores busy | threads |\n|---|---|---|---|---|---|")
    cases = [(f"1 session, 1 core, {n} runs", [("0", n)], ({}, {})),
             (f"1 session, 2 cores, {n} runs", [("0,1", n)], ({}, {})),
             (f"2 sessions, 1 core each, {n // 2} runs each", [("0", n // 2), ("1", n // 2)], ({}, {}))]
    cases += [(f"1 session, 2 cores, {option}", [("0,1", n)], opts) for option, opts in OPTIONS.items()]
    for name, jobs, opts in cases:
        r = measure(ctx_model, jobs, opts)
        print(f"| {name} | {r['wall']:.2f} | {r['per_run_ms']:.1f} | {r['cpu']:.2f} | {r['cpu'] / r['wall']:.2f} | "
              f"{r['threads']} |", flush=True)
    print(f"load after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

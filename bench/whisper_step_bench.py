"""Benchmark of Whisper tiny.en's decoder on the x86 HTP emulator (not a test): prints Markdown tables.

    python bench/whisper_step_bench.py --before REPO --after REPO [--variants w8a16,fp16] [--chip SM8750]
                                       [--runs 5] [--evaluate]

REPO is a built model repo (its out/whisper_tiny_en/): --before one with the KV-cache-free 48-token decoder
(main before issue 21), --after one with the one-token step decoder and its caches. Either may be left out.

1. Per decoder run, interleaved (before, after, before, after, ...: the machine is shared, so both see the same
   load): the compiled binary's `_ctx.onnx` run on the emulator with a real evaluation input of its repo
   (out/whisper_tiny_en/float/decoder.evaluation.npz: the 48-token decoder's padded transcript, the step
   decoder's middle step of a held-out clip). Median wall time of `--runs` runs after one warm-up run.
2. Per generated token: greedy decoding of one utterance of n text tokens runs the 48-token decoder n + 1 times
   (the last run yields <|endoftext|>) and the step decoder n + 2 times (one more for the
   <|startoftranscript|><|notimestamps|> prefix, fed one token at a time). The table gives both over the 4 held-out
   clips' measured token counts (from the float model's evaluate report).
3. The emulator's own count of HTP cycles for one run (QNN profiling, "Accelerator (execute) time (cycles)"), median
   of `--runs` profiled runs per side, interleaved: the count is not the same from run to run (0.25-0.31 G for one
   input of the step decoder at load 3), so the sides take turns; with the ops that take the most of them.
4. With --evaluate: the whole evaluate stage per variant (`doit forget` + `doit evaluate:...` in each repo,
   interleaved), its wall time and WER.
The load average before and after is printed: compare the ratios, not the absolute seconds across runs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = "whisper_tiny_en"


def _runner(repo: Path, variant: str, chip: str):
    """(run(), what was fed): the decoder binary of one repo on one evaluation sample."""
    import numpy as np

    from build_rules.measuring.samples import load_evaluation
    from build_rules.toolchains import ort_qnn

    ctx = repo / "out" / MODEL / variant / chip / "decoder_ctx.onnx"
    inputs, _ = load_evaluation(str(repo / "out" / MODEL / "float" / "decoder.evaluation.npz"))
    sample = inputs[len(inputs) // 2] if "offset" in inputs[0] else inputs[0]
    sample = {k: np.ascontiguousarray(v) for k, v in sample.items()}
    run = ort_qnn.open_context_binary(ctx)
    run(sample)  # warm-up: the first run includes graph set-up
    return (lambda: run(sample)), ", ".join(f"{k} {list(v.shape)}" for k, v in list(sample.items())[:2])


def per_run(repos: dict[str, Path], variants: list[str], chip: str, runs: int) -> dict:
    times = {}
    for variant in variants:
        runners = {side: _runner(repo, variant, chip)[0] for side, repo in repos.items()}
        samples = {side: [] for side in repos}
        for _ in range(runs):
            for side, run in runners.items():  # interleaved
                started = time.perf_counter()
                run()
                samples[side].append(time.perf_counter() - started)
        times[variant] = {side: statistics.median(s) for side, s in samples.items()}
        times[variant]["all"] = samples
        print(f"  {variant}: " + ", ".join(f"{side} {statistics.median(s):.3f} s ({', '.join(f'{x:.2f}' for x in s)})"
                                           for side, s in samples.items()), file=sys.stderr, flush=True)
    return times


def emulator_cycles(repo: Path, variant: str, chip: str, top: int = 3) -> tuple[int, list[tuple[str, float]]]:
    """(HTP cycles of one decoder run, [(op, share of the cycles)] of the `top` ops), from QNN's detailed profile.
    The emulator's count is not the same from run to run (the same input: 0.25-0.31 G for the step decoder at load
    3): compare sides interleaved (cycles_interleaved)."""
    import csv
    import tempfile

    import numpy as np

    from build_rules.measuring.samples import load_evaluation
    from build_rules.toolchains import ort_qnn

    ctx = repo / "out" / MODEL / variant / chip / "decoder_ctx.onnx"
    inputs, _ = load_evaluation(str(repo / "out" / MODEL / "float" / "decoder.evaluation.npz"))
    sample = inputs[len(inputs) // 2] if "offset" in inputs[0] else inputs[0]
    with tempfile.TemporaryDirectory(prefix="whisper-bench-") as tmp:
        profile = Path(tmp) / "profile.csv"
        ort = ort_qnn._ort()
        options = ort_qnn._qnn_session_options(ort, {"backend_type": "htp", "profiling_level": "detailed",
                                                     "profiling_file_path": str(profile)})
        session = ort.InferenceSession(str(ctx), sess_options=options)
        session.run(None, {k: np.ascontiguousarray(v) for k, v in sample.items()})
        del session  # the profile is written when the session ends
        rows = list(csv.reader(profile.open()))[1:]
    total = next(int(r[2]) for r in rows if r[6] == "Accelerator (execute) time (cycles)")
    nodes = sorted(((int(r[2]), r[6].split(":")[0].removesuffix(" (cycles)")) for r in rows if r[1] == "NODE"),
                   reverse=True)
    return total, [(name, cycles / total) for cycles, name in nodes[:top]]


def cycles_interleaved(repos: dict[str, Path], variant: str, chip: str, runs: int) -> dict:
    """side -> (median cycles, min, max, top ops of the median run) over `runs` profiled runs per side, the sides
    taking turns so that both see the same machine."""
    counted = {side: [] for side in repos}
    for _ in range(runs):
        for side, repo in repos.items():
            counted[side].append(emulator_cycles(repo, variant, chip))
    result = {}
    for side, found in counted.items():
        found.sort(key=lambda c: c[0])
        median = found[len(found) // 2]
        result[side] = (statistics.median(c[0] for c in found), found[0][0], found[-1][0], median[1])
    return result


def _text_tokens(repo: Path) -> list[int]:
    """Text tokens greedy decoding produced per held-out clip, from the float evaluate log of the repo (the
    hypotheses), tokenized as the hooks do."""
    import runpy
    hooks = runpy.run_path(str(repo / "models" / MODEL / "export.py"))
    log = (repo / "out" / MODEL / "float" / "model.evaluate.log").read_text()
    hyps = [line.split("hyp:", 1)[1].strip() for line in log.splitlines() if "hyp:" in line]
    tok = hooks["tokenizer"]()
    return [len(tok.encode(" " + h)) for h in hyps]


def evaluate_stage(repos: dict[str, Path], variants: list[str], chip: str) -> dict:
    results = {}
    for variant in variants:
        task = f"evaluate:{MODEL}/{variant}@{chip}"
        for side, repo in repos.items():
            env = {**os.environ, "PYTHONPATH": str(repo)}
            subprocess.run([sys.executable, "-m", "doit", "forget", task], cwd=repo, env=env, check=True,
                           capture_output=True)
            started = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "doit", task], cwd=repo, env=env, capture_output=True,
                                  text=True)
            seconds = time.perf_counter() - started
            if proc.returncode != 0:
                sys.exit(f"{repo}: doit {task} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
            report = json.loads((repo / "out" / MODEL / variant / chip / "evaluate.json").read_text())
            results[(variant, side)] = {"seconds": seconds, "wer": report["metrics"]["wer"],
                                        "runs": report.get("graph_runs", {})}
            print(f"  {task} ({side}): {seconds:.0f} s, wer {report['metrics']['wer']:.3f}, runs "
                  f"{report.get('graph_runs')}", file=sys.stderr, flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="repo with the 48-token decoder, built")
    parser.add_argument("--after", type=Path, help="repo with the step decoder, built")
    parser.add_argument("--variants", default="w8a16,fp16")
    parser.add_argument("--chip", default="SM8750")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--evaluate", action="store_true", help="also time the whole evaluate stage")
    args = parser.parse_args()
    repos = {side: path.resolve() for side, path in (("before", args.before), ("after", args.after)) if path}
    if not repos:
        parser.error("give --before and/or --after")
    sys.path.insert(0, str(next(iter(repos.values()))))
    variants = [v for v in args.variants.split(",") if v]
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; {os.cpu_count()} cores", file=sys.stderr)
    times = per_run(repos, variants, args.chip, args.runs)
    tokens = {side: _text_tokens(repo) for side, repo in repos.items()}
    print(f"\nDecoder on the HTP emulator ({args.chip}), median of {args.runs} interleaved runs:\n")
    print("| variant | " + " | ".join(f"{side}: s per run" for side in repos)
          + " | " + " | ".join(f"{side}: s per generated token" for side in repos)
          + (" | after / before (per token) |" if len(repos) == 2 else " |"))
    print("|---" * (1 + 2 * len(repos) + (len(repos) == 2)) + "|")
    for variant in variants:
        cells, per_token = [], {}
        for side in repos:
            n = sum(tokens[side])
            runs = n + len(tokens[side]) * (1 if side == "before" else 2)
            per_token[side] = times[variant][side] * runs / n
            cells.append(f"{times[variant][side]:.3f}")
        row = f"| {variant} | " + " | ".join(cells) + " | " + " | ".join(f"{per_token[s]:.3f}" for s in repos)
        if len(repos) == 2:
            row += f" | {per_token['after'] / per_token['before']:.3f}"
        print(row + " |")
    print("\nText tokens of the held-out clips (float greedy): "
          + "; ".join(f"{side} {tokens[side]}" for side in repos))
    print(f"\nHTP cycles of one decoder run as the emulator counts them, median (min-max) of {args.runs} interleaved "
          "profiled runs:\n")
    print("| variant | " + " | ".join(f"{side}: cycles per run (top ops of the median run)" for side in repos)
          + (" | after / before per run | after / before per token |" if len(repos) == 2 else " |"))
    print("|---" * (1 + len(repos) + 2 * (len(repos) == 2)) + "|")
    for variant in variants:
        counted = cycles_interleaved(repos, variant, args.chip, args.runs)
        cells = [f"{median / 1e9:.3f} G ({low / 1e9:.3f}-{high / 1e9:.3f}; "
                 f"{', '.join(f'{n} {share:.0%}' for n, share in top)})" for median, low, high, top in counted.values()]
        row = f"| {variant} | " + " | ".join(cells)
        if len(repos) == 2:
            ratio = counted["after"][0] / counted["before"][0]
            runs = {side: sum(tokens[side]) + len(tokens[side]) * (1 if side == "before" else 2) for side in repos}
            per_token = ratio * (runs["after"] / sum(tokens["after"])) / (runs["before"] / sum(tokens["before"]))
            row += f" | {ratio:.3f} | {per_token:.3f}"
        print(row + " |")
    if args.evaluate:
        results = evaluate_stage(repos, variants, args.chip)
        print(f"\nThe whole evaluate stage (`doit evaluate:{MODEL}/<variant>@{args.chip}`, 4 clips), interleaved:\n")
        print("| variant | " + " | ".join(f"{side}: s (WER, decoder runs)" for side in repos)
              + (" | after / before |" if len(repos) == 2 else " |"))
        print("|---" * (1 + len(repos) + (len(repos) == 2)) + "|")
        for variant in variants:
            cells = [f"{results[(variant, s)]['seconds']:.0f} ({results[(variant, s)]['wer']:.3f}, "
                     f"{results[(variant, s)]['runs'].get('decoder')})" for s in repos]
            row = f"| {variant} | " + " | ".join(cells)
            if len(repos) == 2:
                row += f" | {results[(variant, 'after')]['seconds'] / results[(variant, 'before')]['seconds']:.3f}"
            print(row + " |")
    load = os.getloadavg()
    print(f"\nload average at the end {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Whisper tiny.en W4A16 and W8A8 with onnxruntime's min-max vs AIMET's (not a test): prints a Markdown table.

    python bench/aimet_whisper.py [--variants w4a16,w4a16_seqmse] [--candidates 10] [--keep DIR] [--emulator]

A kept DIR is reused: its exports, calibration and build cache stay, and recipes it does not have yet are added.

In a fresh copy of the repo (models/whisper_tiny_en, SM8750, its own build cache) it adds the variants named
(RECIPES: W4A16 and W8A8 with onnxruntime's min-max and AIMET's min-max (its HTP config alone), W4A16 with SeqMSE,
W4A16 as LPBQ in blocks of 64 (docs/block_quantization.md) with onnxruntime's min-max or AIMET's SeqMSE, with the
logits projection at int8, and LPBQ 16 with the encoder's 9 most sensitive weights at int8) and builds, with the real doit, the float WER (evaluate:whisper_tiny_en/float) and the variants' QDQ models. Then the model's own evaluate hook (greedy decoding
of the held-out clips, WER) runs on those QDQ models with onnxruntime on the CPU, and with --emulator also on the
compiled binaries on the HTP emulator (evaluate:whisper_tiny_en/<variant>@SM8750; slow: tens of seconds per encoder
run). The CPU QDQ numbers are not the emulator's (research/ort-qnn.md section 4): they say whether the weights and
encodings can work at all, before the emulator's hour.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# name -> (model.toml table, the stage that quantizes it, what the table calls it)
RECIPES = {
    "w4a16": ("""activations = "uint16"
weights = "int4"
per_channel = true
calibration = { method = "minmax", samples = 8 }""", "quantize", "ort min-max"),
    "w4a16_aimet": ("""inherits = "w4a16"
quantizer = "aimet"
""", "aimet", "aimet min-max"),
    "w4a16_seqmse": ("""inherits = "w4a16"
quantizer = "aimet"
techniques = ["seq_mse"]
seq_mse = { candidates = CANDIDATES }""", "aimet", "aimet seq_mse"),
    "w4a16_lpbq": ("""activations = "uint16"
weights = "int4"
block_size = 64
calibration = { method = "minmax", samples = 8 }
# the decoder's two embedding tables (Gathers; onnxruntime quantizes them per tensor) at int8
graphs = { decoder = { weight_overrides = { node_index_select = "int8", node_index_select_1 = "int8" } } }""",
                   "quantize", "ort min-max, LPBQ 64, embedding tables int8"),
    "w4a16_lpbq_vocab8": ('inherits = "w4a16_lpbq"\n'
                          'graphs = { decoder = { weight_overrides = { node_index_select = "int8", '
                          'node_index_select_1 = "int8", node_matmul_16 = "int8" } } }',
                          # one int8 table, per tensor, read by the token Gather and the logits MatMul (tied)
                          "quantize", "ort min-max, LPBQ 64, embedding tables and logits MatMul int8"),
    # LPBQ in blocks of 16, both embedding tables int8, and the encoder's 9 weights that cost its outputs the most
    # when quantized alone (bench/whisper_lpbq_diag.py sensitivity) at int8: the two Conv1d, the cross-attention
    # value projections of the 4 decoder layers, block 0's Gemm_3 and Gemm_5 and block 3's fc2 (Gemm_42)
    "w4a16_lpbq16_enc8": ('activations = "uint16"\nweights = "int4"\nblock_size = 16\n'
                          'calibration = { method = "minmax", samples = 8 }\n'
                          'graphs = { decoder = { weight_overrides = { node_index_select = "int8", '
                          'node_index_select_1 = "int8" } }, encoder = { weight_overrides = { node_conv1d = "int8", '
                          'node_conv1d_1 = "int8", Gemm_3 = "int8", Gemm_5 = "int8", Gemm_42 = "int8", '
                          'Gemm_45 = "int8", Gemm_47 = "int8", Gemm_49 = "int8", Gemm_51 = "int8" } } }',
                          "quantize", "ort min-max, LPBQ 16, embedding tables and 9 encoder weights int8"),
    # the same with AIMET's SeqMSE; SeqMSE takes a group of layers reading one input only all blocked or all 8-bit, so
    # block 0's q/k/v/out and all 8 cross-attention K/V projections are int8 (15 encoder weights)
    "w4a16_lpbq16_enc8g_seqmse": ('activations = "uint16"\nweights = "int4"\nblock_size = 16\n'
                                  'calibration = { method = "minmax", samples = 8 }\nquantizer = "aimet"\n'
                                  'techniques = ["seq_mse"]\nseq_mse = { candidates = CANDIDATES }\n'
                                  'graphs = { decoder = { weight_overrides = { node_index_select = "int8", '
                                  'node_index_select_1 = "int8" } }, encoder = { weight_overrides = { '
                                  + ", ".join(f'{n} = "int8"' for n in (
                                      "node_conv1d", "node_conv1d_1", "node_MatMul_6", "Gemm_1", "Gemm_3", "Gemm_5",
                                      "Gemm_42", "Gemm_45", "Gemm_47", "Gemm_49", "Gemm_51", "node_MatMul_145",
                                      "node_MatMul_149", "node_MatMul_153", "node_MatMul_157")) + " } } }",
                                  "aimet", "aimet seq_mse, LPBQ 16, embedding tables and 15 encoder weights int8"),
    "w4a16_lpbq_seqmse": ("""inherits = "w4a16_lpbq"
quantizer = "aimet"
techniques = ["seq_mse"]
seq_mse = { candidates = CANDIDATES }""", "aimet", "aimet seq_mse, LPBQ 64"),
    "w8a8": ("""activations = "uint8"
weights = "uint8"
per_channel = true
calibration = { method = "minmax", samples = 8 }""", "quantize", "ort min-max"),
    "w8a8_aimet": ("""activations = "uint8"
weights = "int8"
per_channel = true
quantizer = "aimet"
calibration = { method = "minmax", samples = 8 }""", "aimet", "aimet min-max"),
}


def doit(repo: Path, env: dict, *tasks: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "doit", "-n", "2", "-P", "thread", "--continue", *tasks], cwd=repo,
                          env=env, capture_output=True, text=True)
    return proc.stdout + proc.stderr


def cpu_wer(repo: Path, variant: str) -> tuple[dict, float]:
    from build_rules.stages import evaluate
    started = time.perf_counter()
    cwd = os.getcwd()
    os.chdir(repo)
    try:
        metrics, _, _ = evaluate.measure({"hooks": "models/whisper_tiny_en/export.py", "on": "cpu",
                                         "data_dir": "out/whisper_tiny_en/data",
                                         "graphs": {g: f"out/whisper_tiny_en/{variant}/{g}.qdq.onnx"
                                                    for g in ("encoder", "decoder")}})
        return metrics, time.perf_counter() - started
    finally:
        os.chdir(cwd)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--candidates", type=int, default=10, help="SeqMSE candidates (aimet-onnx's default: 20)")
    parser.add_argument("--emulator", action="store_true", help="also the WER of the compiled binaries (slow)")
    parser.add_argument("--keep", help="build in this folder and keep it (default: a temp folder, removed)")
    parser.add_argument("--variants", default="w4a16,w4a16_seqmse", help=f"of {', '.join(RECIPES)} (w4a16_* inherit "
                        "w4a16 and w4a16_lpbq_* w4a16_lpbq: name it too)")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in RECIPES]
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(RECIPES)}")
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-aimet-whisper-"))
    repo = work / "repo"
    if not repo.exists():
        (repo / "models").mkdir(parents=True)
        shutil.copy(ROOT / "dodo.py", repo / "dodo.py")
        shutil.copy(ROOT / "chips.toml", repo / "chips.toml")
        shutil.copytree(ROOT / "models/whisper_tiny_en", repo / "models/whisper_tiny_en")
    toml = repo / "models/whisper_tiny_en/model.toml"
    text = toml.read_text()  # a kept repo gets the variants it does not have yet (its exports and cache stay)
    toml.write_text(text + "".join(
        f"\n[variants.{v}]\n" + RECIPES[v][0].replace("CANDIDATES", str(args.candidates)) + "\n"
        for v in variants if f"[variants.{v}]" not in text))
    env = dict(os.environ, BUILD_RULES_CACHE=str(work / "cache"))
    tasks = ["evaluate:whisper_tiny_en/float"] + [f"{RECIPES[v][1]}:whisper_tiny_en/{g}/{v}"
                                                  for g in ("encoder", "decoder") for v in variants]
    (work / "doit.log").write_text(doit(repo, env, *tasks))
    float_wer = json.loads((repo / "out/whisper_tiny_en/float/model.evaluate.json").read_text())["metrics"]["wer"]
    seconds = {}
    for line in (repo / "out/.build-state/build.log").read_text().splitlines():
        parts = line.split("\t")
        if len(parts) == 4 and parts[2] == "ran":
            seconds[parts[3]] = float(parts[1])
    print(f"Whisper tiny.en, held-out clips, greedy WER (float ONNX on the CPU: {float_wer:.3f}); SeqMSE "
          f"{args.candidates} candidates, 8 calibration clips\n")
    print("| variant | quantizer | WER, QDQ on CPU | WER, HTP emulator (SM8750) | binaries encoder + decoder (MB) "
          "| quantizer time encoder + decoder (s) |")
    print("|---|---|---|---|---|---|")
    for variant in variants:
        stage = RECIPES[variant][1]
        metrics, _ = cpu_wer(repo, variant)
        emulator = "not run"
        if args.emulator:
            (work / f"doit-{variant}.log").write_text(doit(repo, env, f"evaluate:whisper_tiny_en/{variant}@SM8750"))
            folder = repo / f"out/whisper_tiny_en/{variant}/SM8750"
            try:  # a failed gate writes no report: its numbers stay in the measurement memo
                emulator = f"{json.loads((folder / 'evaluate.json').read_text())['metrics']['wer']:.3f}"
            except (OSError, ValueError, KeyError):
                try:
                    memo = json.loads((folder / "evaluate.measure.json").read_text())
                    emulator = f"{memo['metrics']['wer']:.3f} (gate failed)"
                except (OSError, ValueError, KeyError):
                    emulator = f"failed (see {work / f'doit-{variant}.log'})"
        binaries = [repo / f"out/whisper_tiny_en/{variant}/SM8750/{g}.bin" for g in ("encoder", "decoder")]
        size = " + ".join(f"{b.stat().st_size / 1e6:.1f}" if b.is_file() else "-" for b in binaries)
        quantizer = sum(seconds.get(f"{stage}:whisper_tiny_en/{g}/{variant}", 0.0) for g in ("encoder", "decoder"))
        print(f"| {variant} | {RECIPES[variant][2]} | {metrics['wer']:.3f} | {emulator} | {size} | {quantizer:.0f} |",
              flush=True)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

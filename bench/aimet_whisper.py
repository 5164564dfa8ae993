"""Whisper tiny.en W4A16 with onnxruntime's min-max vs AIMET SeqMSE (not a test): prints a Markdown table.

    python bench/aimet_whisper.py [--candidates 10] [--keep DIR] [--emulator]

In a fresh copy of the repo (models/whisper_tiny_en, SM8750, its own build cache) it adds the variants w4a16 (ort)
and w4a16_seqmse (quantizer = "aimet", techniques = ["seq_mse"]) and builds, with the real doit, the float WER
(evaluate:whisper_tiny_en/float) and both variants' QDQ models. Then the model's own evaluate hook (greedy decoding
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
VARIANTS = """
[variants.w4a16]
activations = "uint16"
weights = "int4"
per_channel = true
calibration = {{ method = "minmax", samples = 8 }}

[variants.w4a16_seqmse]
inherits = "w4a16"
quantizer = "aimet"
techniques = ["seq_mse"]
seq_mse = {{ candidates = {candidates} }}
"""


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
        out = Path(tempfile.mkdtemp()) / "report.json"
        evaluate.run({"name": f"cpu:{variant}", "hooks": "models/whisper_tiny_en/export.py",
                      "data_dir": "out/whisper_tiny_en/data", "on": "cpu", "gate": None,
                      "graphs": {g: f"out/whisper_tiny_en/{variant}/{g}.qdq.onnx" for g in ("encoder", "decoder")},
                      "outputs": {"report": str(out)}})
        return json.loads(out.read_text())["metrics"], time.perf_counter() - started
    finally:
        os.chdir(cwd)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--candidates", type=int, default=10, help="SeqMSE candidates (aimet-onnx's default: 20)")
    parser.add_argument("--emulator", action="store_true", help="also the WER of the compiled binaries (slow)")
    parser.add_argument("--keep", help="build in this folder and keep it (default: a temp folder, removed)")
    args = parser.parse_args()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-aimet-whisper-"))
    repo = work / "repo"
    if not repo.exists():
        (repo / "models").mkdir(parents=True)
        shutil.copy(ROOT / "dodo.py", repo / "dodo.py")
        shutil.copy(ROOT / "chips.toml", repo / "chips.toml")
        shutil.copytree(ROOT / "models/whisper_tiny_en", repo / "models/whisper_tiny_en")
        toml = repo / "models/whisper_tiny_en/model.toml"
        toml.write_text(toml.read_text() + VARIANTS.format(candidates=args.candidates))
    env = dict(os.environ, BUILD_RULES_CACHE=str(work / "cache"))
    tasks = ["evaluate:whisper_tiny_en/float"] + [f"{stage}:whisper_tiny_en/{g}/{v}" for g in ("encoder", "decoder")
                                                  for stage, v in (("quantize", "w4a16"), ("aimet", "w4a16_seqmse"))]
    (work / "doit.log").write_text(doit(repo, env, *tasks))
    float_wer = json.loads((repo / "out/whisper_tiny_en/float/model.evaluate.json").read_text())["metrics"]["wer"]
    seconds = {}
    for line in (repo / "out/.build-state/build.log").read_text().splitlines():
        parts = line.split("\t")
        if len(parts) == 4 and parts[2] == "ran":
            seconds[parts[3]] = float(parts[1])
    print(f"Whisper tiny.en, held-out clips, greedy WER (float ONNX on the CPU: {float_wer:.3f}); SeqMSE "
          f"{args.candidates} candidates, 8 calibration clips\n")
    print("| variant | quantizer | WER, QDQ on CPU | WER, HTP emulator (SM8750) | quantizer time encoder + decoder (s) |")
    print("|---|---|---|---|---|")
    for variant, stage in (("w4a16", "quantize"), ("w4a16_seqmse", "aimet")):
        metrics, _ = cpu_wer(repo, variant)
        emulator = "not run"
        if args.emulator:
            (work / f"doit-{variant}.log").write_text(doit(repo, env, f"evaluate:whisper_tiny_en/{variant}@SM8750"))
            try:
                report = json.loads((repo / f"out/whisper_tiny_en/{variant}/SM8750/evaluate.json").read_text())
                emulator = f"{report['metrics']['wer']:.3f}"
            except (OSError, ValueError, KeyError):
                emulator = f"failed (see {work / f'doit-{variant}.log'})"
        quantizer = sum(seconds.get(f"{stage}:whisper_tiny_en/{g}/{variant}", 0.0) for g in ("encoder", "decoder"))
        print(f"| {variant} | {'ort min-max' if stage == 'quantize' else 'aimet seq_mse'} | {metrics['wer']:.3f} | "
              f"{emulator} | {quantizer:.0f} |")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

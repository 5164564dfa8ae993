"""Benchmark of quantizers and AIMET techniques on MTCNN (not a test): prints a Markdown table.

    python bench/aimet_techniques.py [--graphs pnet,rnet,onet] [--chip SM8750] [--precisions w8a8,w4a16]
                                     [--methods ort,aimet,seq_mse,adaround] [--adaround-iterations 2000]
                                     [--seq-mse-candidates 20] [--jobs 2] [--keep DIR]

In a fresh copy of the repo (models/mtcnn with the chosen graphs and one chip, its own build cache) it adds one
variant per precision and method and builds every binary with the real `doit -n <jobs> -P thread --continue`:
ort = onnxruntime's min-max recipe (today's quantize stage), aimet = AIMET min-max with the chip's HTP QuantSim
config, seq_mse / adaround = AIMET with that technique. Per graph and variant: the gate metric and the worst
output's cosine on the HTP emulator (whole evaluation set; from the check's measurement, also when the gate
fails), the context binary's size, and the quantizer's time (the quantize or aimet stage, from the build log).
Needs aimet-onnx (pip install -e '.[aimet]').
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRECISIONS = {"w8a8": ("uint8", {"ort": "uint8", "aimet": "int8"}), "w4a16": ("uint16", {"ort": "int4", "aimet": "int4"}),
              "w8a16": ("uint16", {"ort": "uint8", "aimet": "int8"})}


def variants(precisions: list[str], methods: list[str], iterations: int, candidates: int = 20) -> str:
    text = ""
    for precision in precisions:
        activations, weights = PRECISIONS[precision]
        for method in methods:
            text += f"\n[variants.{precision}_{method}]\nactivations = \"{activations}\"\n"
            text += "calibration = { method = \"minmax\", samples = 64 }\n"
            if method == "ort":
                text += f"weights = \"{weights['ort']}\"\n"
                continue
            text += f"weights = \"{weights['aimet']}\"\nquantizer = \"aimet\"\n"
            if method != "aimet":
                text += f"techniques = [\"{method}\"]\n"
            if method == "adaround":
                text += f"adaround = {{ iterations = {iterations} }}\n"
            if method == "seq_mse":
                text += f"seq_mse = {{ candidates = {candidates} }}\n"
    return text


def make_repo(work: Path, graphs: list[str], chip: str, extra: str) -> Path:
    repo = work / "repo"
    if repo.exists():
        shutil.rmtree(repo)
    (repo / "models").mkdir(parents=True)
    shutil.copy(ROOT / "dodo.py", repo / "dodo.py")
    shutil.copy(ROOT / "chips.toml", repo / "chips.toml")
    shutil.copytree(ROOT / "models/mtcnn", repo / "models/mtcnn")
    toml = repo / "models/mtcnn/model.toml"
    text = toml.read_text()
    head, rest = text[:text.index("[graphs.")], text[text.index("[graphs."):text.index("[variants.")]
    kept = []
    for block in rest.split("\n[graphs.")[0:]:
        name = block.removeprefix("[graphs.").split("]", 1)[0]
        if name in graphs:
            kept.append(block if block.startswith("[graphs.") else "[graphs." + block)
    head = head.replace('hooks = "export.py"', f'hooks = "export.py"\nchips = ["{chip}"]', 1)
    toml.write_text(head + "\n".join(kept) + extra)
    return repo


def stage_seconds(repo: Path) -> dict[str, float]:
    """Seconds of each quantize / aimet task that ran, from the build log (start, seconds, how, task per line)."""
    seconds = {}
    for line in (repo / "out/.build-state/build.log").read_text().splitlines():
        parts = line.split("\t")
        if len(parts) == 4 and parts[2] == "ran" and parts[3].split(":")[0] in ("aimet", "quantize"):
            seconds[parts[3]] = float(parts[1])
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", default="pnet,rnet,onet")
    parser.add_argument("--chip", default="SM8750")
    parser.add_argument("--precisions", default="w8a8,w4a16")
    parser.add_argument("--methods", default="ort,aimet,seq_mse,adaround")
    parser.add_argument("--adaround-iterations", type=int, default=2000)
    parser.add_argument("--seq-mse-candidates", type=int, default=20, help="aimet-onnx's default: 20")
    parser.add_argument("--jobs", default="2")
    parser.add_argument("--keep", help="build in this folder and keep it (default: a temp folder, removed)")
    args = parser.parse_args()
    graphs, precisions, methods = (args.graphs.split(","), args.precisions.split(","), args.methods.split(","))
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-aimet-"))
    repo = make_repo(work, graphs, args.chip, variants(precisions, methods, args.adaround_iterations,
                                                                 args.seq_mse_candidates))
    env = dict(os.environ, BUILD_RULES_CACHE=str(work / "cache"))
    proc = subprocess.run([sys.executable, "-m", "doit", "-n", args.jobs, "-P", "thread", "--continue"], cwd=repo,
                          env=env, capture_output=True, text=True)
    (work / "doit.log").write_text(proc.stdout + proc.stderr)
    seconds = stage_seconds(repo)
    gates = {}
    for graph in graphs:
        text = (repo / "models/mtcnn/model.toml").read_text()
        block = text[text.index(f"[graphs.{graph}]"):]
        gates[graph] = block[block.index("gate = {"):].split("metric = \"", 1)[1].split("\"", 1)[0]
    adaround = f"; AdaRound {args.adaround_iterations} iterations" if "adaround" in methods else ""
    if "seq_mse" in methods:
        adaround += f"; SeqMSE {args.seq_mse_candidates} candidates"
    load = os.getloadavg()[0]
    print(f"MTCNN on {args.chip}, HTP emulator, whole evaluation set (worst output){adaround}; doit exit code "
          f"{proc.returncode} (gates may fail); load average {load:.1f} at the end\n")
    print("| graph | variant | gate metric | cosine (worst output) | binary (KB) | quantizer time (s) | config |")
    print("|---|---|---|---|---|---|---|")
    for graph in graphs:
        for precision in precisions:
            for method in methods:
                name = f"{precision}_{method}"
                folder = repo / f"out/mtcnn/{name}"
                try:
                    measured = json.loads((folder / args.chip / f"{graph}.measure.json").read_text())["metrics"]
                    size = (folder / args.chip / f"{graph}.bin").stat().st_size / 1e3
                except (OSError, ValueError, KeyError):
                    print(f"| {graph} | {name} | not built (see {work / 'doit.log'}) | | | | |")
                    continue
                cosine = min(o["cosine"] for o in measured["outputs"].values())
                metric = gates[graph]
                value = measured.get("score", {}).get(metric, cosine if metric == "cosine" else None)
                task = f"{'quantize' if method == 'ort' else 'aimet'}:mtcnn/{graph}/{name}"
                config = "–"
                if method != "ort":
                    config = json.loads((folder / f"{graph}.aimet.json").read_text())["config"]["file"]
                print(f"| {graph} | {name} | {metric} {value:.4f} | {cosine:.4f} | {size:.1f} | "
                      f"{seconds.get(task, float('nan')):.1f} | {config} |")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

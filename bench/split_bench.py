"""What splitting a graph costs and keeps, on real models (Markdown tables; numbers go in docs/split.md).

    python bench/split_bench.py mtcnn   [--variants fp16,w8a16,w8a8] [--samples 40]
    python bench/split_bench.py whisper [--variants w8a16] [--from REPO]

mtcnn: MTCNN's O-Net (one chip, SM8750) built whole, then the same repo with `split = { parts = 2 }`: which tasks
re-ran, each binary's size against the parts' sum, compile time (the compile tasks' wall time, and QNN's own compile
time from <graph>.compile.json), the check's metrics, and the emulator time of the chain against the single graph
(the same evaluation samples through both, alternating, in this process).
whisper: Whisper tiny.en's decoder under a small budget: `max_context_mb = 45` stops the whole decoder at the size
check (99 MB at fp16, 51 MB at w8a16), `split = { parts = 3 }` builds it; the same rows plus the greedy-decoding WER
of encoder + decoder (the evaluate stage) on the emulator, whole against split. --from a repo where whisper_tiny_en
is built already (its out/ is copied; the SDK-independent stages are not made again).

The emulator is slow and this machine is shared: run with nice, and compare ratios from one run.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
CHIP = "SM8750"


def build_log(repo: Path) -> dict[str, float]:
    """task -> seconds of its last run (out/.build-state/build.log)."""
    seconds = {}
    for line in (repo / "out/.build-state/build.log").read_text().splitlines():
        parts = line.split("\t")
        if len(parts) == 4 and not line.startswith("#"):
            seconds[parts[3]] = float(parts[1])
    return seconds


def doit(repo: Path, *args: str):
    from conftest import run_doit
    started = time.time()
    result = run_doit(repo, "-v", "0", *args)
    if result.code != 0:
        raise SystemExit(f"doit {' '.join(args)} failed:\n{result.output[-4000:]}")
    return result, time.time() - started


def _emulator_ratio(whole_ctx: Path, part_ctx: list[Path], evaluation: Path, samples: int) -> tuple[float, float]:
    """Seconds per sample: the whole graph's binary, the chain of parts (loaded once each, runs alternating)."""
    from build_rules.emulator import chain
    from build_rules.measuring.samples import load_evaluation
    from build_rules.toolchains import ort_qnn
    inputs, _ = load_evaluation(str(evaluation))
    inputs = inputs[:samples]
    run_whole, run_chain = ort_qnn.open_context_binary(whole_ctx), chain.open_on_emulator(part_ctx)
    whole = parts = 0.0
    for sample in inputs:
        t = time.perf_counter()
        run_whole(sample)
        whole += time.perf_counter() - t
        t = time.perf_counter()
        run_chain(sample)
        parts += time.perf_counter() - t
    return whole / len(inputs), parts / len(inputs)


def _rows(whole_repo: Path, split_repo: Path, model: str, graph: str, variants: list[str], parts: int,
          samples: int, emulator: bool = True) -> list[str]:
    whole_log, split_log = build_log(whole_repo), build_log(split_repo)
    lines = ["| variant | whole binary | parts (sum) | parts / whole | compile tasks whole / parts (s) | QNN compile "
             "whole / parts (s) | check task whole / chain (s) | gate metric whole / chain | emulator s/sample whole "
             "/ chain |", "|---|---|---|---|---|---|---|---|---|"]
    for v in variants:
        folder_w, folder_s = whole_repo / f"out/{model}/{v}/{CHIP}", split_repo / f"out/{model}/{v}/{CHIP}"
        size_w = (folder_w / f"{graph}.bin").stat().st_size
        size_p = [(folder_s / f"{graph}.part{k}.bin").stat().st_size for k in range(1, parts + 1)]
        task_w = whole_log.get(f"compile:{model}/{graph}/{v}@{CHIP}", float("nan"))
        task_p = sum(split_log.get(f"compile:{model}/{graph}.part{k}/{v}@{CHIP}", float("nan"))
                     for k in range(1, parts + 1))
        qnn_w = json.loads((folder_w / f"{graph}.compile.json").read_text())["seconds"]
        qnn_p = sum(json.loads((folder_s / f"{graph}.part{k}.compile.json").read_text())["seconds"]
                    for k in range(1, parts + 1))
        check_w = whole_log.get(f"check:{model}/{graph}/{v}@{CHIP}", float("nan"))
        check_p = split_log.get(f"check:{model}/{graph}/{v}@{CHIP}", float("nan"))
        report_w = json.loads((folder_w / f"{graph}.check.json").read_text())
        report_p = json.loads((folder_s / f"{graph}.check.json").read_text())
        metric = next((g["metric"] for g in report_w.get("gates") or []), "cosine")  # the first gate's metric
        emu = ("–", "–")
        if emulator:
            emu = _emulator_ratio(folder_w / f"{graph}_ctx.onnx",
                                  [folder_s / f"{graph}.part{k}_ctx.onnx" for k in range(1, parts + 1)],
                                  whole_repo / f"out/{model}/float/{graph}.evaluation.npz", samples)
            emu = (f"{emu[0]:.3f}", f"{emu[1]:.3f} ({emu[1] / emu[0]:.2f} x)")
        lines.append(f"| {v} | {size_w / 1e6:.3f} MB | {' + '.join(f'{b / 1e6:.3f}' for b in size_p)} = "
                     f"{sum(size_p) / 1e6:.3f} MB | {sum(size_p) / size_w:.3f} | {task_w:.1f} / {task_p:.1f} | "
                     f"{qnn_w:.2f} / {qnn_p:.2f} | {check_w:.1f} / {check_p:.1f} | {metric} "
                     f"{report_w['summary'][metric]:.4f} / {report_p['summary'][metric]:.4f} | {emu[0]} / {emu[1]} |")
    return lines


def _set_graph_keys(toml: Path, graph: str, keys: str) -> None:
    text = toml.read_text()
    header = f"[graphs.{graph}]\n"
    assert header in text, header
    toml.write_text(text.replace(header, header + keys + "\n"))


def mtcnn(args) -> None:
    from conftest import make_repo
    base = Path(tempfile.mkdtemp(prefix="split-bench-mtcnn-"))
    if args.source:  # the whole O-Net repo of an earlier run of this benchmark
        whole = Path(args.source)
    else:
        whole = make_repo(base / "whole", {"mtcnn": ROOT / "models/mtcnn"})
        toml = whole / "models/mtcnn/model.toml"
        text = toml.read_text()
        # O-Net alone on one chip: drop the other graphs' tables and the multi-SoC extra
        text = re.sub(r"\n\[graphs\.(pnet|rnet)\]\n(?:(?!\n\[).)*", "\n", text, flags=re.S)
        text = text.replace('hooks = "export.py"', f'hooks = "export.py"\nchips = ["{CHIP}"]').replace(
            "[dist]\nmulti_soc = true", "")
        toml.write_text(text)
    variants = args.variants.split(",")
    first, seconds = doit(whole, "mtcnn")
    print(f"whole O-Net build: {len(first.ran)} tasks, {seconds:.0f} s ({whole})")
    split = base / "split"
    shutil.copytree(whole, split, symlinks=True)
    _set_graph_keys(split / "models/mtcnn/model.toml", "onet", "split = { parts = 2 }")
    second, seconds = doit(split, "mtcnn")
    stages = sorted({t.split(":")[0] for t in second.ran})
    print(f"then split into 2 parts: {len(second.ran)} tasks ({', '.join(stages)}), {seconds:.0f} s\n")
    plan = json.loads((split / "out/mtcnn/float/onet.split.json").read_text())
    print("cut:", "; ".join(", ".join(f"{t['name']} {t['dtype']}{t['shape']}" for t in c["tensors"])
                            for c in plan["cuts"]), "\n")
    print("\n".join(_rows(whole, split, "mtcnn", "onet", variants, 2, args.samples)))
    print(f"\n(repos kept in {base})")


def whisper(args) -> None:
    from conftest import make_repo
    base = Path(tempfile.mkdtemp(prefix="split-bench-whisper-"))
    whole = make_repo(base / "whole", {"whisper_tiny_en": ROOT / "models/whisper_tiny_en"})
    if args.source:
        shutil.copytree(Path(args.source) / "out", whole / "out", symlinks=True)
        shutil.rmtree(whole / "out/.build-state", ignore_errors=True)
    variants = args.variants.split(",")
    targets = [t for v in variants for t in (f"check:whisper_tiny_en/decoder/{v}@{CHIP}",
                                             f"evaluate:whisper_tiny_en/{v}@{CHIP}")]
    first, seconds = doit(whole, *targets)
    print(f"whole decoder: {len(first.ran)} tasks, {seconds:.0f} s")
    split = base / "split"
    shutil.copytree(whole, split, symlinks=True)
    toml = split / "models/whisper_tiny_en/model.toml"
    _set_graph_keys(toml, "decoder", "max_context_mb = 45")
    from conftest import run_doit
    refused = run_doit(split, "-v", "0", f"compile:whisper_tiny_en/decoder/{variants[0]}@{CHIP}")
    message = re.search(r"size:whisper_tiny_en/decoder/\w+: .*", refused.output)
    print("budget 45 MB, unsplit:", message.group(0) if message else refused.output[-500:])
    _set_graph_keys(toml, "decoder", "split = { parts = 3 }")
    second, seconds = doit(split, *targets)
    stages = sorted({t.split(":")[0] for t in second.ran})
    print(f"split into 3 parts: {len(second.ran)} tasks ({', '.join(stages)}), {seconds:.0f} s\n")
    plan = json.loads((split / "out/whisper_tiny_en/float/decoder.split.json").read_text())
    for part in plan["parts"]:
        print(f"- {part['name']}: {part['nodes']} nodes ({part['first_node']} .. {part['last_node']}), estimated "
              + ", ".join(f"{v} {b / 1e6:.1f} MB" for v, b in part["estimates"].items()))
    print("cuts:", "; ".join(", ".join(f"{t['name']} {t['dtype']}{t['shape']}" for t in c["tensors"])
                             for c in plan["cuts"]), "\n")
    print("\n".join(_rows(whole, split, "whisper_tiny_en", "decoder", variants, 3, args.samples)))
    print("\n| variant | WER whole | WER split | evaluate task whole / split (s) |\n|---|---|---|---|")
    whole_log, split_log = build_log(whole), build_log(split)
    for v in variants:
        w = json.loads((whole / f"out/whisper_tiny_en/{v}/{CHIP}/evaluate.json").read_text())["metrics"]["wer"]
        s = json.loads((split / f"out/whisper_tiny_en/{v}/{CHIP}/evaluate.json").read_text())["metrics"]["wer"]
        name = f"evaluate:whisper_tiny_en/{v}@{CHIP}"
        print(f"| {v} | {w:.4f} | {s:.4f} | {whole_log.get(name, float('nan')):.0f} / "
              f"{split_log.get(name, float('nan')):.0f} |")
    print(f"\n(repos kept in {base})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", choices=("mtcnn", "whisper"))
    parser.add_argument("--variants", default=None)
    parser.add_argument("--samples", type=int, default=None, help="evaluation samples for the emulator timing")
    parser.add_argument("--from", dest="source", help="whisper: a repo whose out/ has whisper_tiny_en built; "
                                                      "mtcnn: the whole O-Net repo of an earlier run")
    args = parser.parse_args()
    if args.model == "mtcnn":
        args.variants = args.variants or "fp16,w8a16,w8a8"
        args.samples = args.samples or 40
        mtcnn(args)
    else:
        args.variants = args.variants or "w8a16"
        args.samples = args.samples or 2
        whisper(args)


if __name__ == "__main__":
    main()

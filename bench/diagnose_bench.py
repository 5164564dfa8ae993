"""Benchmark of `doit diagnose` (not a test): prints a Markdown table.

    python bench/diagnose_bench.py [--samples 4] [--chip SM8750] [--keep DIR]

In fresh repos it builds, for one chip, MTCNN's O-Net (w8a8 and fp16; 20 activation tensors) and PP-OCRv4's text
detector from the rapidocr_onnxruntime wheel (1x3x256x256, w8a8; 262 activation tensors, 983 QDQ nodes), then times
`doit diagnose:<model>/<graph>/<variant>@<chip>` with the real doit command, and for comparison that graph's `doit
check` (the plain binary over the whole evaluation set). Each diagnose row gives the parts the stage log measures:
the in-process compile with every tensor exposed, the emulator runs, the rest (the CPU QDQ and float runs, the plain
binary on the same samples for the exposure check, the comparisons, the report).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

DET_HOOKS = '''"""Crops of scikit-image's scanned page and text images, normalised as PP-OCR's detector expects."""
def _crops(count, seed):
    import numpy as np
    import skimage.color
    import skimage.data
    from skimage.transform import resize
    pages = [skimage.data.page() / 255.0, skimage.color.rgb2gray(skimage.data.text()) if skimage.data.text().ndim == 3
             else skimage.data.text() / 255.0]
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        page = pages[i % 2]
        size = int(rng.integers(96, min(page.shape)))
        top, left = int(rng.integers(0, page.shape[0] - size + 1)), int(rng.integers(0, page.shape[1] - size + 1))
        crop = resize(page[top:top + size, left:left + size], (256, 256), anti_aliasing=True)
        mean, std = np.array([0.485, 0.456, 0.406])[:, None, None], np.array([0.229, 0.224, 0.225])[:, None, None]
        out.append({"x": ((np.stack([crop] * 3) - mean) / std)[None].astype(np.float32)})
    return out
def calibration_inputs(graph, count):
    return _crops(count, 0)
def evaluation_inputs(graph):
    return _crops(4, 1)
'''

DET_TOML = '''[model]
onnx = "pkg:rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"
hooks = "hooks.py"
chips = ["{chip}"]
[graphs.det]
inputs = {{ x = {{ shape = [1, 3, 256, 256], dtype = "float32" }} }}
calibration_samples = 16
gate = {{ metric = "cosine", min = 0.5 }}
[variants.w8a8]
activations = "uint8"
weights = "uint8"
per_channel = true
calibration = {{ samples = 16 }}
'''


def doit(repo: Path, *args: str, env_extra: dict | None = None) -> float:
    env = dict(os.environ, **(env_extra or {}))
    env.pop("BUILD_RULES_CACHE", None)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "doit", *args], cwd=repo, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"doit {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return seconds


def new_repo(work: Path, name: str) -> Path:
    repo = work / name
    if repo.exists():
        shutil.rmtree(repo)
    (repo / "models").mkdir(parents=True)
    shutil.copy(ROOT / "dodo.py", repo / "dodo.py")
    shutil.copy(ROOT / "chips.toml", repo / "chips.toml")
    return repo


def parts(log: Path) -> dict:
    text = log.read_text()
    compiled = re.search(r"compiled with (\d+) outputs in ([\d.]+) s; (\d+) emulator runs in ([\d.]+) s", text)
    return {"outputs": int(compiled.group(1)), "compile": float(compiled.group(2)),
            "emulator": float(compiled.group(4))}


def measure(repo: Path, model: str, graph: str, variant: str, chip: str, samples: int) -> dict:
    target = f"{model}/{graph}/{variant}@{chip}"
    doit(repo, f"compile:{target}", f"verify:{model}/{graph}")
    check = doit(repo, f"check:{target}")
    seconds = doit(repo, f"diagnose:{target}", env_extra={"BUILD_RULES_DIAGNOSE_SAMPLES": str(samples)})
    folder = repo / f"out/{model}/{variant}/{chip}"
    report = json.loads((folder / f"{graph}.diagnose.json").read_text())
    checked = json.loads((folder / f"{graph}.check.json").read_text())
    return {"target": target, "tensors": report["tensors_total"], "exposed": report["exposed"], "seconds": seconds,
            "check": check, "check_samples": checked["samples"], "identical": report["exposure"]["identical"],
            **parts(folder / f"{graph}.diagnose.log")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--chip", default="SM8750")
    parser.add_argument("--keep", help="build in this folder and keep it (default: a temp folder, removed)")
    args = parser.parse_args()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-diagnose-"))
    try:
        mtcnn = new_repo(work, "mtcnn")
        shutil.copytree(ROOT / "models/mtcnn", mtcnn / "models/mtcnn")
        toml = mtcnn / "models/mtcnn/model.toml"
        toml.write_text(toml.read_text().replace('hooks = "export.py"', f'hooks = "export.py"\nchips = ["{args.chip}"]',
                                                 1))
        det = new_repo(work, "ppocr")
        (det / "models/ppocr_det").mkdir()
        (det / "models/ppocr_det/hooks.py").write_text(DET_HOOKS)
        (det / "models/ppocr_det/model.toml").write_text(DET_TOML.format(chip=args.chip))
        rows = [measure(mtcnn, "mtcnn", "onet", "w8a8", args.chip, args.samples),
                measure(mtcnn, "mtcnn", "onet", "fp16", args.chip, args.samples),
                measure(det, "ppocr_det", "det", "w8a8", args.chip, args.samples)]
        print(f"`doit diagnose` with {args.samples} evaluation samples, {args.chip}, HTP emulator:\n")
        print("| diagnose | activation tensors (exposed) | diagnose (s) | compile exposed (s) | emulator runs (s) "
              "| rest (s) | exposed = plain binary | `doit check` (s, samples) |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            rest = r["seconds"] - r["compile"] - r["emulator"]
            print(f"| `{r['target']}` | {r['tensors']} ({r['exposed']}) | {r['seconds']:.1f} | {r['compile']:.1f} | "
                  f"{r['emulator']:.1f} | {rest:.1f} | {'bit-identical' if r['identical'] else 'differs'} | "
                  f"{r['check']:.1f} ({r['check_samples']}) |")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""doit tune's per-layer weight bits on MTCNN's R-Net (not a test): variant LPBQ 64 with onnxruntime's min-max (box
cosine 0.853 on the emulator), target cosine >= 0.98 (issue 30's R-Net target), SM8750, 64 calibration crops. Prints
the ladder: each rung's bytes and numbers, the per-layer search's CPU ranking and probes, and the proposal.

    python bench/tune_weight_bits.py <empty folder>        (docs/benchmarks.md, "Weight bits per layer")
"""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

VARIANTS = """
[variants.lpbq64]
activations = "uint16"
weights = "int4"
block_size = 64
calibration = { method = "minmax", samples = 64 }

[tuning]
chip = "SM8750"
samples = 16
"""


def main() -> int:
    from conftest import run_doit
    from test_aimet import rnet_repo
    repo = rnet_repo(Path(sys.argv[1]), VARIANTS)
    toml = repo / "models/mtcnn/model.toml"
    text = toml.read_text().replace("calibration_samples = 16", "calibration_samples = 64")
    text = re.sub(r'chips = \[.*?\]', 'chips = ["SM8750"]', text, count=1)
    toml.write_text(text.replace('gate = { metric = "cosine", min = 0.95 }', 'gate = { metric = "cosine", min = 0.98 }'))
    built = run_doit(repo, "--continue")  # the variant misses its gate: the build fails there, as a user's would
    print("build:", built.output.strip().splitlines()[-1], flush=True)
    started = time.perf_counter()
    tuned = run_doit(repo, "tune:mtcnn/lpbq64")
    print(f"tune: exit {tuned.code}, {time.perf_counter() - started:.0f} s", flush=True)
    found = json.loads((repo / "out/mtcnn/tuning/lpbq64.tuned.json").read_text())
    print("| rung | bytes | numbers |\n|---|---|---|")
    for rung in found["ladder"]["rungs"]:
        for graph, r in rung["graphs"].items():
            print(f"| {rung['name']} | {r.get('bytes')} | {r.get('full') or r.get('subset') or r.get('error')} |")
        for probe in rung.get("probes", []):
            print(f"| {rung['name']} probe: {probe['int8']} at int8 | {probe.get('bytes')} | "
                  f"{probe.get('full') or probe.get('subset') or probe.get('error')} meets={probe['meets']} |")
        if "ranked" in rung:
            print("ranked:", rung["ranked"])
    print("chosen:", found.get("chosen"), "\nnotes:", found["ladder"].get("notes"))
    print((repo / "out/mtcnn/tuning/lpbq64.tuned.toml").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Emulator checks of a five-chip build: every chip in full against one chip in full and the others proven equal to
it (issue 27; not a test): prints a Markdown table.

    python bench/check_chips_bench.py [--model mtcnn] [--model ppocr_det] [-j 2]

Each model is built once in a scratch repo (build cache off). Then, twice, every check's outputs and memos are
removed and the checks (with their packages) run again under `doit -j`: first with BUILD_RULES_CHECK_EVERY_CHIP=1
(every chip's binary measured over the whole evaluation set: what the build did before), then as the build does
by default. The emulator time is the sum of the check tasks' seconds in out/.build-state/build.log of that run;
the wall time is the whole `doit` command's. The row also says which chips' outputs differed, if any.
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
sys.path.insert(0, str(ROOT))

from build_rules.doit_run.project import EVERY_CHIP_ENV  # noqa: E402
from build_rules.build_log import read_build_log  # noqa: E402

DOIT = [shutil.which("doit") or "doit"]
ENV = dict(os.environ, BUILD_RULES_CACHE="off",
           PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
ENV.pop(EVERY_CHIP_ENV, None)


# The PP-OCR detector of bench/models is built for SM8750 with a gate its w8a8 misses on purpose (the tuning
# benchmarks); here it is built for the five default chips, gated where it passes.
EDITS = {"ppocr_det": [('chips = ["SM8750"]', 'chips = ["SM8550", "SM8650", "SM8750", "SM8850", "QCS9100"]'),
                       ('gate = { metric = "cosine", min = 0.97 }', 'gate = { metric = "cosine", min = 0.9 }')]}


def scratch(dest: Path, model: str) -> Path:
    dest.mkdir(parents=True)
    shutil.copy(ROOT / "dodo.py", dest)
    shutil.copy(ROOT / "chips.toml", dest)
    source = ROOT / "models" / model if (ROOT / "models" / model).is_dir() else ROOT / "bench/models" / model
    shutil.copytree(source, dest / "models" / model)
    toml = dest / "models" / model / "model.toml"
    for old, new in EDITS.get(model, []):
        assert old in toml.read_text(), (model, old)
        toml.write_text(toml.read_text().replace(old, new))
    return dest


def doit(repo: Path, *args: str, env: dict | None = None) -> float:
    start = time.perf_counter()
    proc = subprocess.run([*DOIT, *args], cwd=repo, env=env or ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"doit {' '.join(args)} failed in {repo}:\n{proc.stdout[-3000:]}")
    return time.perf_counter() - start


def checks_again(repo: Path, model: str, jobs: int, every_chip: bool) -> dict:
    """Remove every check's report and memo (a missing target: doit runs the check again), run the checks and packages
    again."""
    for path in [*repo.glob(f"out/{model}/*/*/*.check.json"), *repo.glob(f"out/{model}/*/*/*.measure.json")]:
        path.unlink()
    env = dict(ENV, **({EVERY_CHIP_ENV: "1"} if every_chip else {}))
    wall = doit(repo, "-n", str(jobs), "-P", "thread", model, env=env)
    rows = read_build_log(str(repo / "out/.build-state/build.log"), last_build=True)
    checks = [(task, seconds) for _, seconds, how, task in rows if task.startswith("check:")]
    differed = {}
    for task, _ in checks:
        found = json.loads(_report(repo, task).read_text()).get("differs_from")
        if found:  # which output of which sample, and by how much
            differed[task.split(":", 1)[1]] = (f"{found['output']} of sample {found['sample']}, max abs "
                                               f"{found['max_abs']:.3g} against {found['chip']}")
    return {"checks": len(checks), "emulator": sum(s for _, s in checks), "wall": wall, "differed": differed}


def _report(repo: Path, task: str) -> Path:
    model_graph_variant, chip = task.split(":", 1)[1].rsplit("@", 1)
    model, graph, variant = model_graph_variant.split("/")
    return repo / "out" / model / variant / chip / f"{graph}.check.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help="mtcnn (default), ppocr_det (bench/models), ...")
    parser.add_argument("-j", type=int, default=2, help="doit -n")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory(prefix="check-chips-") as tmp:
        for model in args.model or ["mtcnn"]:
            repo = scratch(Path(tmp) / model, model)
            first = doit(repo, "-n", str(args.j), "-P", "thread", model)
            print(f"{model}: first build {first:.0f} s", file=sys.stderr, flush=True)
            before = checks_again(repo, model, args.j, every_chip=True)
            print(f"{model}: every chip {before}", file=sys.stderr, flush=True)
            after = checks_again(repo, model, args.j, every_chip=False)
            print(f"{model}: reference + proofs {after}", file=sys.stderr, flush=True)
            rows.append((model, before, after))
    print(f"load average at start {load:.1f}, doit -n {args.j} -P thread, build cache off\n")
    print("| model | checks | emulator s, every chip in full | emulator s, one chip + proofs | ratio "
          "| wall s, before | wall s, after | ratio | outputs that differed |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model, before, after in rows:
        print(f"| {model} | {before['checks']} | {before['emulator']:.1f} | {after['emulator']:.1f} | "
              f"{after['emulator'] / before['emulator']:.2f} x | {before['wall']:.1f} | {after['wall']:.1f} | "
              f"{after['wall'] / before['wall']:.2f} x | "
              f"{'; '.join(f'{t}: {why}' for t, why in sorted(after['differed'].items())) or 'none'} |")


if __name__ == "__main__":
    main()

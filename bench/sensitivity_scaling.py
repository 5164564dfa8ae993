"""Benchmark of `doit sensitivity` and `doit tune` before and after the bisect search (not a test): a Markdown table.

    python bench/sensitivity_scaling.py [--cases mtcnn,ppocr_det] [--probes 2] [--keep DIR]

Cases, each in a fresh repo (dodo.py, chips.toml, the model folder) built first with `doit --continue` (the gate
fails, as a user's does):
- mtcnn: P-Net and R-Net at w8a8 on SM8750, R-Net's gate raised to cosine >= 0.999 (8-bit activations give 0.997),
  [tuning] samples = 16 (tests/test_quant_tuning.py's setting). Both searches run for real: the sensitivity of R-Net
  (15 candidate tensors) and the tune of the variant, each with [tuning] search = "exhaustive" (before) and
  "bisect" (after), tune from scratch (no sensitivity result to reuse).
- ppocr_det: PP-OCRv4's text detector (bench/models/ppocr_det, 297 candidate tensors, gate cosine >= 0.97,
  [tuning] samples = 4). The bisect searches run for real. The exhaustive ones would take days here, so their time
  is the count of emulator measurements they make (sensitivity 2 + 2n; tune 2n + 3 at least) times the time of
  measurements of the same kinds, measured in-process (--probes of each: n-1 tensors at 16 bit, the kind of the
  exhaustive cost and elimination steps; 1 tensor at 16 bit, the kind of its gain steps): an estimate, said so.
Times: wall seconds and CPU seconds (user + system of the doit process and its stage processes, or of the probes),
with the load average at the start and end of each step: on a shared machine compare ratios from the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = ("mtcnn", "ppocr_det")


def doit(repo: Path, *args: str, check: bool = True) -> dict:
    """Run doit; wall and CPU seconds (this process's children: doit and its stage processes)."""
    env = dict(os.environ)
    env.pop("BUILD_RULES_CACHE", None)  # the copy's own out/.cache
    before, load = resource.getrusage(resource.RUSAGE_CHILDREN), os.getloadavg()[0]
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "doit", *args], cwd=repo, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if check and proc.returncode != 0:
        sys.exit(f"doit {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return {"wall": wall, "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "load": f"{load:.0f}-{os.getloadavg()[0]:.0f}"}


def make_repo(work: Path, name: str) -> Path:
    repo = work / name
    if repo.exists():
        shutil.rmtree(repo)
    (repo / "models").mkdir(parents=True)
    shutil.copy(ROOT / "dodo.py", repo / "dodo.py")
    shutil.copy(ROOT / "chips.toml", repo / "chips.toml")
    if name == "mtcnn":
        shutil.copytree(ROOT / "models/mtcnn", repo / "models/mtcnn")
        toml = repo / "models/mtcnn/model.toml"
        text = toml.read_text()
        text = text[:text.index("# Output net on 48x48")] + text[text.index("[variants.w8a8]"):]
        text = text.replace('hooks = "export.py"', 'hooks = "export.py"\nchips = ["SM8750"]', 1)
        rnet = text.index("[graphs.rnet]")
        text = text[:rnet] + text[rnet:].replace('gate = { metric = "cosine", min = 0.99 }',
                                                 'gate = { metric = "cosine", min = 0.999 }', 1)
        text = text[:text.index("[dist]")] if "[dist]" in text else text
        toml.write_text(text + "\n[tuning]\nsamples = 16\n")
    else:
        shutil.copytree(ROOT / "bench/models/ppocr_det", repo / "models/ppocr_det")
    return repo


def set_search(repo: Path, model: str, method: str) -> None:
    toml = repo / f"models/{model}/model.toml"
    text = re.sub(r'\nsearch = "\w+"', "", toml.read_text())
    # try_variants = false: the tune rows time the mixed-precision search, not issue 20's whole-variant ladder
    # (AIMET's SeqMSE alone took 61 s for the detector's first Conv)
    text = re.sub(r'\ntry_variants = \w+', "", text)
    toml.write_text(text.replace("[tuning]\n", f'[tuning]\nsearch = "{method}"\ntry_variants = false\n', 1))


def forget_tuning(repo: Path, model: str) -> None:
    shutil.rmtree(repo / f"out/{model}/tuning", ignore_errors=True)  # tune from scratch: no ranking to reuse


def tuning_result(repo: Path, model: str, name: str) -> dict:
    return json.loads((repo / f"out/{model}/tuning" / name).read_text())


def run_searches(repo: Path, model: str, graph: str, variant: str, methods: tuple[str, ...]) -> list[dict]:
    rows = []
    for method in methods:
        set_search(repo, model, method)
        forget_tuning(repo, model)
        sens = doit(repo, f"sensitivity:{model}/{graph}/{variant}")
        sensitivity = tuning_result(repo, model, f"{variant}/{graph}.sensitivity.json")
        forget_tuning(repo, model)
        tune = doit(repo, f"tune:{model}/{variant}")
        tuned = tuning_result(repo, model, f"{variant}.tuned.json")["graphs"][graph]
        rows.append({"method": method, "sensitivity": sens, "sensitivity_result": sensitivity, "tune": tune,
                     "tuned": tuned})
    return rows


def probe_times(repo: Path, model: str, graph: str, variant: str, probes: int) -> dict:
    """Wall and CPU seconds of emulator measurements of the exhaustive searches' two kinds, in-process."""
    sys.path.insert(0, str(ROOT))
    cwd = os.getcwd()
    os.chdir(repo)
    try:
        from build_rules import tasks
        from build_rules.doit_run.project import chip_params, project, rel
        from build_rules.stages.support.precision import Candidates
        from build_rules.tasks.tuning import _tuning_chip, _tuning_graph
        tasks.project.cache_clear()
        m = next(x for x in project().models if x.name == model)
        c = Candidates(_tuning_graph(m, m.graphs[graph], m.variants[variant]), chip_params(_tuning_chip(m)),
                       m.tuning.samples, rel(m.hooks))
        out = {"n": len(c.candidates)}
        everything = set(c.candidates)
        for kind, sets in (("heavy", [everything - {t} for t in c.candidates[-probes:]]),
                           ("light", [{t} for t in c.candidates[1:probes + 1]])):
            load = os.getloadavg()[0]
            cpu, wall = time.process_time(), time.perf_counter()
            for s in sets:
                c.measure(s)
            out[kind] = {"wall": (time.perf_counter() - wall) / len(sets),
                         "cpu": (time.process_time() - cpu) / len(sets), "load": f"{load:.0f}-{os.getloadavg()[0]:.0f}"}
        return out
    finally:
        os.chdir(cwd)


def fmt(seconds: float) -> str:
    if seconds >= 7200:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.0f} s"


def table(case: str, rows: list[dict], estimate: dict | None) -> list[str]:
    lines = []
    for row in rows:
        s, t = row["sensitivity_result"], row["tuned"]
        lines.append(f"| {case} | sensitivity | {row['method']} | {s['evaluations']} | {s.get('cpu_evaluations', 0)} | "
                     f"{fmt(row['sensitivity']['wall'])} | {fmt(row['sensitivity']['cpu'])} | "
                     f"{row['sensitivity']['load']} | |")
        lines.append(f"| {case} | tune | {row['method']} | {t.get('evaluations', 0)} | {t.get('cpu_evaluations', 0)} | "
                     f"{fmt(row['tune']['wall'])} | {fmt(row['tune']['cpu'])} | {row['tune']['load']} | "
                     f"{len(t['sixteen_bit'])} of {t['candidates']} at 16 bit, {t['target']['metric']} "
                     f"{t['tuned'][t['target']['metric']]:.5f} |")
    if estimate:
        n, heavy, light = estimate["n"], estimate["heavy"], estimate["light"]

        def total(count_heavy: int, count_light: int, key: str) -> float:
            return count_heavy * heavy[key] + count_light * light[key]
        kinds = (f"{heavy['wall']:.0f} s wall, {heavy['cpu']:.0f} s CPU each with n-1 at 16 bit (load "
                 f"{heavy['load']}); {light['wall']:.0f} s, {light['cpu']:.0f} s with 1 (load {light['load']})")
        # sensitivity: base, all at 16 bit, n costs (n-1 at 16 bit), n gains (1 at 16 bit): exact counts and kinds
        lines.append(f"| {case} | sensitivity | exhaustive (estimate) | {2 + 2 * n} | 0 | "
                     f"~{fmt(total(n + 1, n + 1, 'wall'))} | ~{fmt(total(n + 1, n + 1, 'cpu'))} | | "
                     f"n + 1 and n + 1 measurements of the two kinds: {kinds} |")
        # tune: n costs for the ranking, all at 16 bit, then n elimination steps that get lighter as tensors go back
        # to 8 bit: between n light ones and n heavy ones (the full-set checks, 8 samples instead of 4, left out)
        low, high = (n + 1, n + 1), (2 * n + 1, 1)
        lines.append(f"| {case} | tune | exhaustive (estimate) | {2 * n + 3} or more | 0 | "
                     f"~{fmt(total(*low, 'wall'))} - {fmt(total(*high, 'wall'))} | "
                     f"~{fmt(total(*low, 'cpu'))} - {fmt(total(*high, 'cpu'))} | | the same kinds |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--probes", type=int, default=2, help="measurements of each kind for the estimate")
    parser.add_argument("--keep", help="build in this folder and keep it (default: a temp folder, removed)")
    args = parser.parse_args()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-sensitivity-"))
    lines = []
    try:
        for case in args.cases.split(","):
            repo = make_repo(work, case)
            build = doit(repo, "-n", "2", "-P", "thread", "--continue", check=False)
            print(f"{case}: built in {fmt(build['wall'])} (the gate fails, as expected)", file=sys.stderr)
            if case == "mtcnn":
                lines += table(case, run_searches(repo, "mtcnn", "rnet", "w8a8", ("exhaustive", "bisect")), None)
            else:
                rows = run_searches(repo, "ppocr_det", "det", "w8a8", ("bisect",))
                lines += table(case, rows, probe_times(repo, "ppocr_det", "det", "w8a8", args.probes))
            print("\n".join(lines), file=sys.stderr)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{os.cpu_count()} CPUs; load: 1-minute load average at the start and end of each step\n")
    print("| graph | task | search | emulator measurements | CPU QDQ runs | wall | CPU | load | result |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

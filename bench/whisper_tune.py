"""`doit tune` on Whisper tiny.en end to end (not a test; issue 36 item 7): a W8A8 variant (onnxruntime min-max, 8
calibration clips; WER 0.684 on the emulator, docs/benchmarks.md) tuned with the defaults a user gets ([tuning]
unset: the whole-variant ladder, AIMET's rungs when aimet-onnx is installed, then the mixed-precision search on the
tuning chip SM8750), its proposal applied with `python -m build_rules.tuning apply` and built: compile, both
graphs' checks and the greedy WER evaluate.

    python bench/whisper_tune.py DIR [--code CHECKOUT] [--tuning KEY=VALUE ...]

DIR: an empty folder for the repo (this checkout's dodo.py, chips.toml and models/whisper_tiny_en, plus the w8a8
variant, and a `[tuning]` table from `--tuning`, e.g. `--tuning try_variants=false --tuning max_measurements=8`
for a run that fits in an afternoon). Every step is a command as a user types it (`doit -n 2 -P thread`, the README's), timed, with the load
average before and after; the tune's log is printed as it comes, so a run cut short still leaves its numbers. At the
end: the proposal, the tuned variant's checks and WER, and the binaries' sizes beside W8A16's.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOIT = shutil.which("doit") or "doit"
MODEL = "whisper_tiny_en"
VARIANT = """
[variants.w8a8]
activations = "uint8"
weights = "uint8"
per_channel = true
calibration = { method = "minmax", samples = 8 }
"""


def step(title: str, cmd: list[str], repo: Path, env: dict, may_fail: bool = False) -> tuple[float, str]:
    """Runs one command, echoing its output line by line; (wall seconds, output)."""
    load = os.getloadavg()[0]
    print(f"\n## {title}: {' '.join(cmd)}  (load {load:.2f}, {time.strftime('%H:%M:%S')})", flush=True)
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        print(f"  {time.perf_counter() - started:7.0f}s | {line}", end="", flush=True)
    code = proc.wait()
    wall = time.perf_counter() - started
    print(f"## {title}: exit {code}, {wall:.0f} s (load {load:.2f} -> {os.getloadavg()[0]:.2f})", flush=True)
    if code != 0 and not may_fail:
        sys.exit(f"{title} failed (exit {code})")
    return wall, "".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir", type=Path)
    parser.add_argument("--code", type=Path, default=ROOT, help="the build_rules checkout to run (default: this one)")
    parser.add_argument("--tuning", action="append", default=[], metavar="KEY=VALUE",
                        help="a [tuning] key for the model (TOML value), e.g. max_measurements=8")
    args = parser.parse_args()
    repo = args.dir
    if repo.exists() and any(repo.iterdir()) and not (repo / "models" / MODEL).is_dir():
        sys.exit(f"{repo} has files and is not a Whisper repo of this bench")
    if not (repo / "models" / MODEL).is_dir():
        repo.mkdir(parents=True, exist_ok=True)
        for name in ("dodo.py", "chips.toml"):
            shutil.copy(ROOT / name, repo / name)
        shutil.copytree(ROOT / "models" / MODEL, repo / "models" / MODEL)
        toml = repo / "models" / MODEL / "model.toml"
        tuning = "".join(f"{item.partition('=')[0].strip()} = {item.partition('=')[2].strip()}\n" for item in args.tuning)
        toml.write_text(toml.read_text() + VARIANT + (f"\n[tuning]\n{tuning}" if tuning else ""))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(args.code), os.environ.get("PYTHONPATH")) if p))
    doit = [DOIT, "-n", "2", "-P", "thread"]
    times = {}
    # The variant as a user first builds it: its checks fail (the build says so and goes on with what it can).
    times["build w8a8"], _ = step("build w8a8", [*doit, "--continue", *(
        f"check:{MODEL}/{g}/w8a8@SM8750" for g in ("encoder", "decoder"))], repo, env, may_fail=True)
    times["tune"], _ = step("tune", [*doit, f"tune:{MODEL}/w8a8"], repo, env)
    tuned_toml = repo / "out" / MODEL / "tuning" / "w8a8.tuned.toml"
    tuned = json.loads(tuned_toml.with_suffix(".json").read_text())
    print("\n## proposal\n" + tuned_toml.read_text(), flush=True)
    if "[variants." not in tuned_toml.read_text():
        print("no variant section to apply: the proposal is in the comments above", flush=True)
        return 0
    step("apply", [sys.executable, "-m", "build_rules.tuning", "apply", str(tuned_toml.relative_to(repo))], repo, env)
    name = tuned["name"]
    times["build tuned"], _ = step("build the proposal", [*doit, "--continue", f"evaluate:{MODEL}/{name}@SM8750",
                                                          f"package:{MODEL}/{name}@SM8750"], repo, env, may_fail=True)
    times["build w8a16"], _ = step("build w8a16 (for the sizes)", [*doit, f"package:{MODEL}/w8a16@SM8750"], repo, env)
    sys.path.insert(0, str(args.code))
    from build_rules.build_state import results
    print("\n| variant | graph | binary MB | check | cosine | sqnr |\n|---|---|---|---|---|---|")
    for variant in ("w8a8", name, "w8a16"):
        for graph in ("encoder", "decoder"):
            folder = repo / "out" / MODEL / variant / "SM8750"
            binary = folder / f"{graph}.bin"
            check = folder / f"{graph}.check.json"
            summary = results.last(str(check)) or {}
            s = summary.get("summary", {})
            print(f"| {variant} | {graph} | {binary.stat().st_size / 1e6 if binary.exists() else float('nan'):.2f} | "
                  f"{summary.get('passed', 'not run')} | {s.get('cosine', float('nan')):.5f} | "
                  f"{s.get('sqnr', float('nan')):.2f} |")
    evaluation = results.last(str(repo / "out" / MODEL / name / "SM8750" / "evaluate.json"))
    print("evaluate:", json.dumps(evaluation and evaluation.get("metrics")), flush=True)
    print("\n| step | wall s |\n|---|---|\n" + "\n".join(f"| {k} | {v:.0f} |" for k, v in times.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Build-system benchmark on the example model (not a test): prints Markdown tables.

    python bench/build_bench.py [--model mtcnn] [--runs 5] [--quick | --load-only]

Everything runs in a scratch copy of the repo (dodo.py, chips.toml, models/<model>), with the
model's checkpoints copied in so the benchmark can change their bytes. Machines are noisy: each
timing is a median of --runs runs where cheap, and every comparison is a ratio measured in the
same run. Full builds are serial (`doit -n 1`) unless the row says otherwise.

Commands run as a user runs them: the `doit` console script and the `python` found on PATH, in the
caller's environment (this machine sets PYTHONDONTWRITEBYTECODE=1; nothing is precompiled here), with
PYTHONPATH pointing at this checkout so its build_rules is the one that loads, whichever checkout the
editable install points at.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


# What a user types: the console script and the interpreter on PATH (here pyenv shims), this checkout's package.
DOIT = [shutil.which("doit") or "doit"]
PYTHON = shutil.which("python") or sys.executable
USER_ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))


def timed(cmd, cwd, env=None) -> float:
    return timed_with_cpu(cmd, cwd, env)[0]


def timed_with_cpu(cmd, cwd, env=None) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system of the process and what it waited for). On a machine shared
    with other work the CPU time moves far less than the wall time."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    proc.stdout.close()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed in {cwd}:\n{output.decode(errors='replace')[-3000:]}")
    return elapsed, usage.ru_utime + usage.ru_stime


def median_time(cmd, cwd, runs, env=None) -> float:
    timed(cmd, cwd, env)  # warm-up
    return statistics.median(timed(cmd, cwd, env) for _ in range(runs))


def interleaved_medians(commands, cwd, runs, env=None) -> list[tuple[float, float]]:
    """(median wall time, median CPU time) of each command, run in turns (a load change hits all of them alike)."""
    for cmd in commands:
        timed(cmd, cwd, env)  # warm-up
    times = [[] for _ in commands]
    for _ in range(runs):
        for cmd, t in zip(commands, times):
            t.append(timed_with_cpu(cmd, cwd, env))
    return [(statistics.median(w for w, _ in t), statistics.median(c for _, c in t)) for t in times]


def ran_count(cwd, *args, cache: bool = True) -> tuple[float, int]:
    """(seconds, tasks run) of one real `doit` command. cache=False turns the build cache off, for rows
    that must measure the stages themselves rather than restoring outputs made before."""
    env = dict(USER_ENV)
    env.pop("BUILD_RULES_CACHE", None)  # the scratch repo's own out/.cache
    if not cache:
        env["BUILD_RULES_CACHE"] = "off"
    start = time.perf_counter()
    proc = subprocess.run([*DOIT, *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(proc.stdout[-3000:])
    return elapsed, len(re.findall(r"^\.  ", proc.stdout, re.M))


def progress(row) -> None:
    """Each row as soon as it is measured (stderr), so a long run that dies still leaves numbers."""
    print(" | ".join(str(x) for x in row), file=sys.stderr, flush=True)


def make_repo(dest: Path, model: str, chips: list[str] | None = None) -> tuple[Path, list[Path]]:
    """A scratch model repo whose checkpoints are local files (so the benchmark can change them):
    (repo, checkpoint files)."""
    from build_rules.configuration.config import load_chips, load_model
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    shutil.copy(ROOT / "dodo.py", dest)
    shutil.copy(ROOT / "chips.toml", dest)
    shutil.copytree(ROOT / "models" / model, dest / "models" / model)
    folder = dest / "models" / model
    config = load_model(ROOT / "models" / model, load_chips(ROOT / "chips.toml"))
    text = (folder / "model.toml").read_text()
    checkpoints = []
    for graph in config.graphs.values():
        for ref, path in zip(config.checkpoints + graph.checkpoints, config.checkpoint_paths(graph)):
            if ref.startswith("pkg:"):
                shutil.copy(path, folder / path.name)
                text = text.replace(f'"{ref}"', f'"{path.name}"')
            checkpoints.append(folder / path.name)
    if chips:
        text = re.sub(r"^chips = .*\n", "", text, flags=re.M)
        text = text.replace("[model]\n", f"[model]\nchips = {json.dumps(chips)}\n", 1)
    (folder / "model.toml").write_text(text)
    return dest, sorted(set(checkpoints))


def perturb_checkpoint(path: Path) -> None:
    """Scale one weight tensor by 1.001: new checkpoint bytes, same architecture."""
    if path.suffix == ".bin":  # CTranslate2 (whisper): scale the last float16 variable in place
        import numpy as np
        sys.path.insert(0, str(path.parent))
        from ct2_reader import read_model
        data = bytearray(path.read_bytes())
        variables = read_model(path, copy=False).variables
        name, array = next((n, a) for n, a in reversed(variables.items()) if a.dtype == np.float16 and a.size > 1000)
        offset = data.find(array.tobytes())
        data[offset:offset + array.nbytes] = (array.astype(np.float32) * 1.001).astype(np.float16).tobytes()
        path.write_bytes(bytes(data))
        return
    import torch
    state = torch.load(path, weights_only=True)
    name = next(k for k, v in state.items() if v.dtype.is_floating_point)
    state[name] = state[name] * 1.001
    torch.save(state, path)


def hash_throughput(size_gib: float) -> dict:
    from build_rules.build_state.hashing import file_digest
    path = Path(tempfile.gettempdir()) / "build_bench_hash.bin"
    block = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for _ in range(int(size_gib * 1024)):
            f.write(block)
    subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL)  # into the page cache

    def md5():
        h = hashlib.md5()
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)

    results = {}
    for name, fn in (("cat", lambda: subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL)),
                     ("xxh3_128 (build_rules)", lambda: file_digest(path)), ("md5 (doit default)", md5)):
        times = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        results[name] = size_gib / statistics.median(times)
    path.unlink()
    return results


def bytes_read_by_noop(repo: Path) -> dict:
    """In-process doit runs, reading the stat cache's byte counter."""
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import run_doit  # the same in-process runner the tests use
    from build_rules.build_state.hashing import stat_cache
    run_doit(repo)
    stat_cache().bytes_hashed = 0
    run_doit(repo)
    untouched = stat_cache().bytes_hashed
    hooks = next((repo / "models").glob("*/export.py"))
    st = hooks.stat()
    os.utime(hooks, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    stat_cache().bytes_hashed = 0
    first = run_doit(repo)
    touched_first = stat_cache().bytes_hashed
    stat_cache().bytes_hashed = 0
    second = run_doit(repo)
    return {"no-op, unchanged inputs": untouched, "first no-op after touching export.py": touched_first,
            "second no-op after the touch": stat_cache().bytes_hashed, "tasks run": len(first.ran | second.ran),
            "export.py bytes": st.st_size}


def ninja_noop(edges: int, runs: int) -> float | None:
    ninja = shutil.which("ninja")
    if not ninja:
        return None
    folder = Path(tempfile.mkdtemp(prefix="ninja-bench-"))
    (folder / "in").mkdir()
    lines = ["rule cp\n  command = cp $in $out\n"]
    for i in range(edges):
        (folder / "in" / f"{i}").write_text(str(i))
        lines.append(f"build out/{i}: cp in/{i}\n")
    (folder / "build.ninja").write_text("".join(lines))
    timed([ninja], folder)
    result = median_time([ninja], folder, runs)
    shutil.rmtree(folder)
    return result


def print_load_rows(tasks: int, import_doit, noop, listing, ninja, runs: int, load: float) -> None:
    """import_doit, noop, listing: (wall, CPU) medians."""
    no_bytecode = os.environ.get("PYTHONDONTWRITEBYTECODE", "")
    print(f"`doit` = {DOIT[0]}, `python` = {PYTHON}, PYTHONDONTWRITEBYTECODE={no_bytecode!r}, "
          f"medians of {runs} interleaved runs; load average when they started: {load:.1f}\n")
    print("| command | wall | ratio | CPU (user + sys) | ratio |\n|---|---|---|---|---|")
    rows = (("`python -c 'import doit'`", import_doit), (f"no-op `doit` ({tasks} tasks)", noop),
            ("`doit list --all`", listing))
    for what, (wall, cpu) in rows:
        print(f"| {what} | {wall * 1000:.0f} ms | {wall / import_doit[0]:.2f} x | {cpu * 1000:.0f} ms | "
              f"{cpu / import_doit[1]:.2f} x |")
    if ninja is not None:
        print(f"\nninja no-op, {tasks} edges: {ninja * 1000:.1f} ms (no-op doit = {noop[0] / ninja:.0f} x ninja)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mtcnn")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "build-bench"))
    parser.add_argument("--quick", action="store_true", help="skip the sherpa-style comparison and hashing")
    parser.add_argument("--load-only", action="store_true", help="the first build, then only the no-op and list rows")
    parser.add_argument("--variant-change", choices=("weights", "samples"), default="weights",
                        help="the one-variant change: weights uint8 -> int8, or calibration samples x 3/4 "
                             "(Whisper: QNN HTP refuses LayerNormalization with int8 weights)")
    args = parser.parse_args()
    work = Path(args.workdir)
    doit = DOIT
    rows = []

    repo, checkpoints = make_repo(work / "ours", args.model)
    full, full_tasks = ran_count(repo, "-n", "1")
    from build_rules.build_log import read_build_log, seconds_per_stage
    first_build_stages = seconds_per_stage(read_build_log(str(repo / "out/.build-state/build.log"), last_build=True))
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    from build_rules.configuration.config import load_chips, load_model
    chip_count = len(load_model(repo / "models" / args.model, load_chips(repo / "chips.toml")).chips)
    rows.append((f"full build, {chip_count} chip(s) (serial)", f"{full:.1f} s", f"{full_tasks} tasks", "1.00"))
    progress(rows[-1])

    # After the first build, as a user has it (that build compiled build_rules' .pyc files: bytecode.py).
    load_runs, load = max(15, 3 * args.runs), os.getloadavg()[0]
    noop, import_doit, listing = interleaved_medians(
        [doit, [PYTHON, "-c", "import doit"], doit + ["list", "--all"]], repo, load_runs, USER_ENV)
    ninja = ninja_noop(full_tasks, args.runs)
    if args.load_only:
        print_load_rows(full_tasks, import_doit, noop, listing, ninja, load_runs, load)
        return

    folder = repo / "models" / args.model
    incremental = []
    checkpoint = checkpoints[-1]
    perturb_checkpoint(checkpoint)
    incremental.append((f"checkpoint {checkpoint.name} changed", *ran_count(repo, "-n", "1")))
    progress(incremental[-1])
    toml = folder / "model.toml"
    original_toml = toml.read_text()
    variant = re.search(r"\[variants\.(\w+)\]\nactivations[^\[]*weights = \"uint8\"[^\[]*", original_toml)
    if args.variant_change == "weights":
        edited, what = variant.group(0).replace('weights = "uint8"', 'weights = "int8"'), "weights uint8 -> int8"
    else:
        samples = int(re.search(r"samples = (\d+)", variant.group(0)).group(1))
        edited = variant.group(0).replace(f"samples = {samples}", f"samples = {samples * 3 // 4}")
        what = f"calibration samples {samples} -> {samples * 3 // 4}"
    toml.write_text(original_toml.replace(variant.group(0), edited))
    incremental.append((f"variant {variant.group(1)}: {what}", *ran_count(repo, "-n", "1")))
    progress(incremental[-1])
    toml.write_text(original_toml)
    incremental.append(("... and flipped back", *ran_count(repo, "-n", "1")))
    progress(incremental[-1])
    chips = repo / "chips.toml"
    original_chips = chips.read_text()
    block = re.search(r"\[chips\.SM8750\][^\[]*", original_chips).group(0)
    chips.write_text(original_chips.replace(block, block.replace("vtcm_mb = 8", "vtcm_mb = 4")))
    incremental.append(("chip SM8750: vtcm_mb 8 -> 4", *ran_count(repo, "-n", "1")))
    progress(incremental[-1])
    chips.write_text(original_chips)
    ran_count(repo, "-n", "1")
    identity_file = next((repo / "out/.build-state").glob("ort-qnn-identity-*.json"))
    identity = json.loads(identity_file.read_text())
    identity["probe"]["build_id"] = "v2.52.0.261101000000"  # stands for an upgraded onnxruntime-qnn
    identity_file.write_text(json.dumps(identity))
    incremental.append(("SDK identity (QNN build id) changed", *ran_count(repo, "-n", "1")))
    progress(incremental[-1])

    # Compiles only, both runs with the build cache off (else the outputs are restored, not compiled).
    subprocess.run(doit + ["forget", "compile"], cwd=repo, capture_output=True, env=USER_ENV)
    serial_compile, serial_n = ran_count(repo, "-n", "1", "compile", cache=False)
    subprocess.run(doit + ["forget", "compile"], cwd=repo, capture_output=True, env=USER_ENV)
    parallel_compile, parallel_n = ran_count(repo, "-n", "2", "-P", "thread", "compile", cache=False)

    print(f"## Build benchmark: {args.model}, {os.cpu_count()} cores, medians of {args.runs} runs\n")
    print("| what | time | tasks run | ratio to full build |\n|---|---|---|---|")
    for what, t, n, ratio in rows:
        print(f"| {what} | {t} | {n} | {ratio} |")
    for what, t, n in incremental:
        print(f"| {what} | {t:.1f} s | {n} | {t / full:.3f} |")
    print(f"\nPeak RSS of the heaviest stage process: {peak_mb:.0f} MB\n")
    print_load_rows(full_tasks, import_doit, noop, listing, ninja, load_runs, load)
    print(f"\n| per-chip compiles ({args.model}) | time | speed-up |\n|---|---|---|")
    print(f"| `doit -n 1 compile` ({serial_n} compiles) | {serial_compile:.1f} s | 1.00 |")
    print(f"| `doit -n 2 -P thread compile` ({parallel_n} compiles) | {parallel_compile:.1f} s | "
          f"{serial_compile / parallel_compile:.2f} |")

    print(f"\nWhere this tool's first full build spent its time (build.log, serial):\n")
    print("| stage | tasks | seconds | per chip? |\n|---|---|---|---|")
    per_chip_stages = {"compile", "check", "package", "evaluate", "convert", "model_libs", "htp_config"}
    for stage, (n, seconds) in sorted(first_build_stages.items(), key=lambda kv: -kv[1][1]):
        shared = "yes (evaluate:<model>/float is shared)" if stage == "evaluate" else "yes"
        print(f"| {stage} | {n} | {seconds:.1f} | {shared if stage in per_chip_stages else 'no, shared'} |")

    if args.quick:
        return
    print("\n| bytes hashed (in-process runs) | bytes |\n|---|---|")
    for what, value in bytes_read_by_noop(repo).items():
        print(f"| {what} | {value} |")
    print("\n| hashing a 1 GiB file (page cache) | GiB/s | ratio to cat |\n|---|---|---|")
    throughput = hash_throughput(1.0)
    for name, value in throughput.items():
        print(f"| {name} | {value:.2f} | {value / throughput['cat']:.2f} |")

    # The sherpa-onnx CI way: one job per chip, each re-running every stage from the checkpoint. Its CI
    # builds binaries only (no emulator check), so that comparison is `doit compile` (every stage up to
    # the context binaries); the full build with per-chip emulator checks is compared as well.
    chips = ("SM8550", "SM8650", "SM8750", "SM8850", "QCS9100")
    ours_compile, _ = ran_count(make_repo(work / "ours-compile", args.model, chips=list(chips))[0], "-n", "1",
                                "compile")
    sherpa_compile = sherpa_full = 0.0
    for chip in chips:
        chip_repo, _ = make_repo(work / f"sherpa-{chip}", args.model, chips=[chip])
        sherpa_compile += ran_count(chip_repo, "-n", "1", "compile")[0]
        sherpa_full += ran_count(chip_repo, "-n", "1")[0]  # the rest of that chip's build: checks, packages
    sherpa_full += sherpa_compile
    variant_change = incremental[1][1]
    print("\n| five chips | per-chip flow | this tool | this tool is |\n|---|---|---|---|")
    print(f"| first build of the binaries (`doit compile`: what sherpa-onnx's CI builds) | {sherpa_compile:.1f} s | "
          f"{ours_compile:.1f} s | {sherpa_compile / ours_compile:.2f} x faster |")
    print(f"| first full build (+ emulator check and package per binary) | {sherpa_full:.1f} s | {full:.1f} s | "
          f"{sherpa_full / full:.2f} x faster |")
    print(f"| rebuild after one variant change (per-chip flow: all again) | {sherpa_full:.1f} s | "
          f"{variant_change:.1f} s | {sherpa_full / variant_change:.2f} x faster |")



if __name__ == "__main__":
    main()

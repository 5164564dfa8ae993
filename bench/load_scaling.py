"""Planning cost as a repo grows: no-op `doit` and `doit list --all` against the number of model folders (not a test).

    python bench/load_scaling.py [--counts 1,3,10,30] [--runs 15] [--workdir DIR] [--real-build] [--no-examples]

Rows, each measured in its own scratch repo: `python -c "import doit"`, a no-op `doit` and `doit list --all` as a user
runs them (console script, python on PATH, build_rules' .pyc files written), interleaved (--runs rounds), medians of
wall and CPU time (user + system) and the ratios to `import doit` of the same round.

- examples: this repo's models/ (MTCNN and Whisper tiny.en) with its chips.toml. Their real build is hours of HTP
  emulator time on a loaded 2-core machine, so every stage's action is replaced by a stand-in that writes each target
  as a one-line file, inside a real doit run (doit's runner, build_rules' state backend, task keys, content checker,
  stat cache): the state is what a real build leaves, for the same tasks and files; only the files' contents and the
  tasks' result values (a few numbers each) differ, and a no-op reads neither.
- N x tinynet: copies of the tiny test model (tests/models/tinynet: 2 graphs x 2 variants x 2 chips, 32 tasks a model,
  the same checkpoint bytes in every copy). The first copy is built for real (`doit -n 2 -P thread`); in the others
  each stage's subprocess is replaced by copying the first model's outputs to the copy's paths, and the package tasks
  run as usual (--real-build builds every copy instead: ~N x the first model's time).
A console `doit` in each repo must then run no task, or the bench stops.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
from build_bench import DOIT, PYTHON, USER_ENV, timed_with_cpu  # noqa: E402

TINYNET = ROOT / "tests" / "models" / "tinynet"
BASE = "tinynet00"


def model_name(i: int) -> str:
    return f"tinynet{i:02d}"


def make_base_repo(repo: Path) -> None:
    shutil.rmtree(repo, ignore_errors=True)
    (repo / "models").mkdir(parents=True)
    shutil.copy(ROOT / "dodo.py", repo)
    shutil.copy(ROOT / "chips.toml", repo)
    shutil.copytree(TINYNET, repo / "models" / BASE)
    subprocess.run([PYTHON, "-c", "import sys; sys.path.insert(0, sys.argv[1]); from conftest import "
                    "write_tinynet_checkpoints as w; from pathlib import Path; w(Path(sys.argv[2]))",
                    str(ROOT / "tests"), str(repo / "models" / BASE)], check=True, env=USER_ENV)


def add_copies(repo: Path, start: int, stop: int) -> None:
    for i in range(start, stop):
        folder = repo / "models" / model_name(i)
        shutil.copytree(repo / "models" / BASE, folder)


def doit(repo: Path, *args: str) -> str:
    proc = subprocess.run([*DOIT, *args], cwd=repo, env=USER_ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"doit {' '.join(args)} failed in {repo}:\n{proc.stdout[-3000:]}")
    return proc.stdout


def up_to_date_count(repo: Path) -> int:
    """A console no-op must run nothing: the number of up-to-date tasks it reports."""
    out = doit(repo)
    match = re.search(r"summary: 0 task\(s\) ran, (\d+) up to date", out)
    if not match:
        raise SystemExit(f"the no-op in {repo} ran tasks:\n{out[-3000:]}")
    return int(match.group(1))


# --- the stand-in build (runs in its own process, cwd = the repo) ---------------------------------------------------

def _copy_outputs(targets: list[str], model: str, result: dict) -> dict:
    """A stage's stand-in: the first model's outputs, copied to this model's paths (new files, new mtimes)."""
    for target in targets:
        source = target.replace(f"out/{model}/", f"out/{BASE}/", 1)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(source, target)
    return result


def _placeholder_outputs(task_name: str, targets: list[str]) -> dict:
    """A stage's stand-in where nothing was built for real: every target, as a one-line file."""
    for target in targets:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w") as f:
            f.write(f"stand-in output of {task_name} (bench/load_scaling.py)\n")
    return {}


def stand_in_build(placeholders: bool) -> None:
    """doit's own run of the default tasks with stand-in actions: copies of the first model's outputs for the other
    models (placeholders=False; the first model's tasks and every package task run as usual), or one-line placeholder
    files for every target of every task (placeholders=True: the example models, whose real build is hours here)."""
    import runpy

    from doit.cmd_base import ModuleTaskLoader
    from doit.doit_cmd import DoitMain

    from build_rules.runner import run_stage

    state = {}
    if not placeholders:
        with open("out/.build-state/doit.json") as f:  # the first model's build, folded by its clean exit
            state = json.load(f)
    namespace = runpy.run_path("dodo.py")

    def stand_in(stage: str, task: dict) -> dict:
        name = task.get("name")
        action = (task.get("actions") or [None])[0]
        if not name or not isinstance(action, tuple):
            return task  # groups
        if placeholders:
            return dict(task, actions=[(_placeholder_outputs, [f"{stage}:{name}", task["targets"]])])
        if action[0] is not run_stage:
            return task  # in-process tasks (package): as they are, on the copied outputs
        model = name.split("/")[0].split("@")[0]
        if model == BASE:
            return task
        base_task = f"{stage}:{BASE}{name[len(model):]}"
        if base_task not in state:
            return task  # not a default task (report, tune, dist, ...): the first model's was not built either
        result = state[base_task].get("result:") or {}
        return dict(task, actions=[(_copy_outputs, [task["targets"], model, result])])

    def wrap(stage: str, creator):
        def creator_with_stand_ins():
            made = creator()
            if made is None:
                return None
            for task in ([made] if isinstance(made, dict) else made):
                yield stand_in(stage, task)
        creator_with_stand_ins.__doc__ = creator.__doc__
        creator_with_stand_ins.__wrapped__ = getattr(creator, "__wrapped__", creator)
        return creator_with_stand_ins

    for key, value in list(namespace.items()):
        if key.startswith("task_") and callable(value):
            namespace[key] = wrap(key[len("task_"):], value)
    code = DoitMain(ModuleTaskLoader(namespace), config_filenames=()).run([])
    if code != 0:
        raise SystemExit(code)


def run_stand_in_build(repo: Path, placeholders: bool) -> None:
    proc = subprocess.run([PYTHON, str(Path(__file__).resolve()), "--stand-in-build"]
                          + (["--placeholders"] if placeholders else []), cwd=repo, env=USER_ENV,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"stand-in build failed in {repo}:\n{proc.stdout[-3000:]}")


def checkout_env(checkout: Path) -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(checkout), os.environ.get("PYTHONPATH")) if p))


def measure(repo: Path, runs: int, compare: Path | None) -> list[tuple]:
    """For this checkout and, with --compare, the other one, in the same rounds: (checkout, tasks up to date, load
    average, (wall, CPU) medians of import doit, of the no-op and of `doit list --all`)."""
    checkouts = [ROOT] + ([compare] if compare else [])
    tasks = up_to_date_count(repo)
    for checkout in checkouts[1:]:
        with_other = subprocess.run(DOIT, cwd=repo, env=checkout_env(checkout), capture_output=True, text=True)
        if f"0 task(s) ran, {tasks} up to date" not in with_other.stdout:
            raise SystemExit(f"{checkout}'s no-op in {repo} is not one:\n{with_other.stdout[-2000:]}")
    commands = [([PYTHON, "-c", "import doit"], USER_ENV)]
    for checkout in checkouts:
        commands += [(DOIT, checkout_env(checkout)), (DOIT + ["list", "--all"], checkout_env(checkout))]
    load = os.getloadavg()[0]
    for cmd, env in commands:
        timed_with_cpu(cmd, repo, env)  # warm-up
    times = [[] for _ in commands]
    for _ in range(runs):
        for (cmd, env), t in zip(commands, times):
            t.append(timed_with_cpu(cmd, repo, env))
    medians = [(statistics.median(w for w, _ in t), statistics.median(c for _, c in t)) for t in times]
    return [(checkout, tasks, load, medians[0], medians[1 + 2 * i], medians[2 + 2 * i])
            for i, checkout in enumerate(checkouts)]


# --- the bench -----------------------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1,3,10,30", help="model counts, ascending")
    parser.add_argument("--runs", type=int, default=15, help="interleaved rounds per row")
    parser.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "load-scaling"))
    parser.add_argument("--real-build", action="store_true", help="build every copy for real (slow)")
    parser.add_argument("--no-examples", action="store_true", help="skip the example models' row")
    parser.add_argument("--keep", action="store_true", help="go on in the scratch repos of an earlier run instead of "
                                                             "starting afresh (its first model built)")
    parser.add_argument("--compare", help="another checkout of build_rules (e.g. main's) measured in the same rounds, "
                                          "on the same built repos")
    parser.add_argument("--stand-in-build", action="store_true", help=argparse.SUPPRESS)  # the child process
    parser.add_argument("--placeholders", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stand_in_build:
        stand_in_build(args.placeholders)
        return
    compare = Path(args.compare).resolve() if args.compare else None
    if compare:  # as after its first build (build_rules/doit_run/bytecode.py): a checkout without .pyc files compiles every load
        subprocess.run([PYTHON, "-m", "compileall", "-q", str(compare / "build_rules")], check=True)
    rows = []
    if not args.no_examples:
        examples = Path(args.workdir) / "examples"
        if not (args.keep and (examples / "out/.build-state/doit.json").exists()):
            shutil.rmtree(examples, ignore_errors=True)
            examples.mkdir(parents=True)
            shutil.copy(ROOT / "dodo.py", examples)
            shutil.copy(ROOT / "chips.toml", examples)
            shutil.copytree(ROOT / "models", examples / "models", ignore=shutil.ignore_patterns("__pycache__"))
            run_stand_in_build(examples, placeholders=True)
        names = ", ".join(sorted(p.name for p in (examples / "models").iterdir() if (p / "model.toml").exists()))
        for row in measure(examples, args.runs, compare):
            rows.append((f"examples ({names}; placeholder outputs)", *row))
            print(" | ".join(str(x) for x in rows[-1]), file=sys.stderr, flush=True)

    counts = sorted(int(c) for c in args.counts.split(",") if c)
    repo = Path(args.workdir) / "repo"
    if counts and not (args.keep and (repo / "out/.build-state/doit.json").exists()):
        make_base_repo(repo)
        doit(repo, "-n", "2", "-P", "thread")
    have = len(list((repo / "models").glob("tinynet*"))) if counts else 0
    if counts and have > counts[0]:
        raise SystemExit(f"{repo} has {have} models already: more than {counts[0]}")
    for count in counts:
        add_copies(repo, have, count)
        if count > 1:  # (again after --keep: copies of an earlier run that were not built yet)
            if args.real_build:
                doit(repo, "-n", "2", "-P", "thread")
            else:
                run_stand_in_build(repo, placeholders=False)
        have = count
        for row in measure(repo, args.runs, compare):
            rows.append((f"{count} x tinynet", *row))
            print(" | ".join(str(x) for x in rows[-1]), file=sys.stderr, flush=True)

    print(f"`doit` = {DOIT[0]}, `python` = {PYTHON}, PYTHONDONTWRITEBYTECODE="
          f"{os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}; medians of {args.runs} interleaved rounds; tinynet "
          f"copies {'built for real' if args.real_build else 'built by the stand-in build (see the docstring)'}\n")
    print("| repo | build_rules | tasks (no-op: up to date) | load avg | `import doit` wall / CPU | no-op wall | CPU | "
          "`list --all` wall | CPU |\n|---|---|---|---|---|---|---|---|---|")
    for what, checkout, tasks, load, (iw, ic), (nw, nc), (lw, lc) in rows:
        print(f"| {what} | {checkout_label(checkout)} | {tasks} | {load:.1f} | {iw * 1000:.0f} / {ic * 1000:.0f} ms | "
              f"{nw / iw:.2f} x | {nc / ic:.2f} x | {lw / iw:.2f} x | {lc / ic:.2f} x |")


def checkout_label(checkout: Path) -> str:
    """The checkout's commit (and `+changes` when its build_rules differs from it)."""
    def git(*args):
        return subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True).stdout.strip()
    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return checkout.name
    return commit + ("+changes" if git("status", "--porcelain", "--", "build_rules") else "")


if __name__ == "__main__":
    main()

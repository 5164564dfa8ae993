"""Where a no-op `doit` (or `doit list --all`) spends its time beyond `import doit`: phase timers (not a test).

    python bench/load_profile.py REPO [--runs 9] [--list]

Each run is a fresh Python process that does what the `doit` console script does (doit.doit_cmd.DoitMain().run)
with timers around doit's and build_rules' phases; medians of CPU time (user + system: a shared machine moves it far
less than wall time) are printed as a Markdown table, next to a `python -c "import doit"` run interleaved with them.
The timers are function wrappers, not a profiler, so the phases cost what they cost in a user's run (~1 us a wrapped
call; the status checks are one call per task).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The child: phases in the order they happen. Written as JSON to a pipe so doit's own output stays apart.
CHILD = r"""
import atexit, json, os, sys, time
clock = time.process_time
marks = {"python start": clock()}
spent = {}
def add(name, seconds):
    spent[name] = spent.get(name, 0.0) + seconds
def timed(owner, attr, name):
    original = getattr(owner, attr)
    def wrapper(*args, **kwargs):
        start = clock()
        try:
            return original(*args, **kwargs)
        finally:
            add(name, clock() - start)
    setattr(owner, attr, wrapper)
import doit
marks["import doit"] = clock()
from doit import cmd_base, control, dependency, doit_cmd, loader, plugin
timed(plugin.PluginDict, "add_plugins", "doit: entry-point scans (commands, backends, reporters)")
timed(cmd_base.NamespaceTaskLoader, "load_tasks", "task generation (creators -> task dicts -> doit Tasks)")
generators = {}
original_generate = loader.generate_tasks
def generate_tasks(name, gen_result, gen_doc=None):
    start = clock()
    try:
        return original_generate(name, gen_result, gen_doc)
    finally:
        generators[name] = generators.get(name, 0.0) + clock() - start
loader.generate_tasks = generate_tasks
timed(control.TaskControl, "__init__", "doit: task graph (TaskControl)")
timed(dependency.Dependency, "get_status", "status checks (state read, file stats, task keys)")
timed(dependency.Dependency, "close", "state save / close")
original_get_module = loader.get_module
def get_module(*args, **kwargs):
    start = clock()
    try:
        import build_rules.tasks  # the import dodo.py does first, timed on its own
        add("  of which: import build_rules", clock() - start)
        from build_rules import tasks
        from build_rules.configuration import config
        timed(tasks, "project", "  of which: config (chips.toml, model.toml files, toolchain identity)")
        timed(config, "load_models", "    of which: model.toml files")
        return original_get_module(*args, **kwargs)
    finally:
        add("dodo.py import (build_rules modules, config, toolchain identity, doit_config)", clock() - start)
loader.get_module = get_module
def report():
    os.write(int(os.environ["LOAD_PROFILE_FD"]), json.dumps({"marks": marks, "spent": spent,
                                                              "generators": generators}).encode())
atexit.register(report)
sys.argv = ["doit", *sys.argv[1:]]
code = doit_cmd.DoitMain().run(sys.argv[1:])
sys.stdout.flush()
marks["doit done"] = clock()
sys.exit(code)
"""


def child_run(repo: Path, args: list[str], env: dict) -> dict:
    read, write = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, *args], cwd=repo, env=dict(env, LOAD_PROFILE_FD=str(write)),
                            pass_fds=(write,), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    os.close(write)
    data = b""
    while chunk := os.read(read, 65536):
        data += chunk
    os.close(read)
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0 or not data:
        raise SystemExit(f"doit {' '.join(args)} failed in {repo}:\n{err[-2000:]}")
    result = json.loads(data)
    result["cpu"] = usage.ru_utime + usage.ru_stime
    return result


def import_doit_cpu(env: dict) -> float:
    proc = subprocess.Popen([sys.executable, "-c", "import doit"], env=env)
    _, _, usage = os.wait4(proc.pid, 0)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo")
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--list", action="store_true", help="profile `doit list --all` instead of a no-op")
    parser.add_argument("args", nargs="*", help="doit arguments (default: none, or `list --all` with --list)")
    opts = parser.parse_args()
    repo = Path(opts.repo).resolve()
    args = opts.args or (["list", "--all"] if opts.list else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    child_run(repo, args, env)  # warm-up
    runs, baseline = [], []
    load = os.getloadavg()[0]
    for _ in range(opts.runs):
        baseline.append(import_doit_cpu(env))
        runs.append(child_run(repo, args, env))
    base = statistics.median(baseline) * 1000

    def med(values):
        return statistics.median(values) * 1000

    total = med(r["cpu"] for r in runs)
    print(f"`doit {' '.join(args)}` in {repo}: medians of {opts.runs} runs (CPU ms, user + system), "
          f"load average {load:.1f} at the start\n")
    print("| phase | CPU ms | share of `import doit` |\n|---|---|---|")
    print(f"| `python -c 'import doit'` (its own process) | {base:.1f} | 1.00 |")
    print(f"| the whole command (its own process) | {total:.1f} | {total / base:.2f} |")
    start = med(r["marks"]["python start"] for r in runs)
    imported = med(r["marks"]["import doit"] - r["marks"]["python start"] for r in runs)
    print(f"| python start-up (in the child, before `import doit`) | {start:.1f} | {start / base:.2f} |")
    print(f"| import doit (in the child) | {imported:.1f} | {imported / base:.2f} |")
    names = list(dict.fromkeys(n for r in runs for n in r["spent"]))
    # the dodo.py import's parts are timed (and so recorded) before it: print them after it
    parts = [n for n in names if n.startswith(" ")]
    names = [m for n in names if not n.startswith(" ") for m in [n] + (parts if n.startswith("dodo.py") else [])]
    for name in names:
        value = med(r["spent"].get(name, 0.0) for r in runs)
        print(f"| {name} | {value:.1f} | {value / base:.3f} |")
    rest = med(r["marks"]["doit done"] - r["marks"]["import doit"]
               - sum(v for n, v in r["spent"].items() if not n.startswith(" ")) for r in runs)
    print(f"| the rest of doit (option parsing, runner, reporter) | {rest:.1f} | {rest / base:.3f} |")
    ending = med(r["cpu"] - r["marks"]["doit done"] for r in runs)
    print(f"| exit (atexit: stat cache, journal; interpreter teardown) | {ending:.1f} | {ending / base:.3f} |")
    print("\n| task generator (`task_<name>`: its dicts and doit's Tasks) | CPU ms | share of `import doit` |\n|---|---|---|")
    for name in sorted({n for r in runs for n in r["generators"]}, key=lambda n: -med(r["generators"].get(n, 0.0)
                                                                                         for r in runs)):
        value = med(r["generators"].get(name, 0.0) for r in runs)
        print(f"| {name} | {value:.2f} | {value / base:.3f} |")


if __name__ == "__main__":
    main()

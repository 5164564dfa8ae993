"""Every task's key digest and the code it runs, one line a task (not a test): run it before and after a change to
the task generators and diff the two listings; a line that differs is a task that would re-run in users' repos.

    cd REPO && PYTHONPATH=CODE python CODE/bench/task_keys.py > keys.txt

Loads the tasks as doit does (every task_* creator of build_rules.tasks, in order), without running any. The
toolchain is the repo's (BUILD_RULES_TOOLCHAIN, QNN_SDK_ROOT and BUILD_RULES_QAIRT_FLOW choose as in a build).
"""
from __future__ import annotations

import sys

from doit.loader import generate_tasks


def main() -> None:
    from build_rules import tasks
    for name in tasks.__all__:
        if not name.startswith("task_"):
            continue
        creator = getattr(tasks, name)
        for task in generate_tasks(name[len("task_"):], creator(), creator.__doc__):
            keys = [u.digest for u in task.uptodate if hasattr(u[0] if isinstance(u, tuple) else u, "digest")
                    for u in [u[0] if isinstance(u, tuple) else u]]
            runs = []
            for action in task.actions:
                py = getattr(action, "py_callable", None)
                if py is None:
                    continue
                args = list(getattr(action, "args", []) or [])
                runs.append(f"{py.__name__}({args[0] if args and isinstance(args[0], str) else ''})")
            print(task.name, " ".join(keys) or "-", " ".join(runs) or "-", sep="\t")


if __name__ == "__main__":
    sys.exit(main())

"""python -m build_rules init [--empty] [DIR] | run <ctx.onnx|bin> --input NAME=FILE.npy ...  (see README.md)"""
from __future__ import annotations

import sys

COMMANDS = {
    "init": ("build_rules.init_repo", "write dodo.py, chips.toml and models/ (with an example model; --empty: "
                                      "none) into an empty folder"),
    "run": ("build_rules.run_binary", "run a compiled binary on the x86 HTP emulator; outputs as .npy"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        lines = [f"  {name:5} {doc}" for name, (_, doc) in COMMANDS.items()]
        stream = sys.stdout if argv and argv[0] in ("-h", "--help") else sys.stderr
        print("usage: python -m build_rules {init,run} ...\n" + "\n".join(lines)
              + "\n(the build itself: doit, in a folder with dodo.py; `python -m build_rules.dist` for bundles)",
              file=stream)
        return 0 if stream is sys.stdout else 2
    import importlib
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())

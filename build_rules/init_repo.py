"""`python -m build_rules init [--empty] [DIR]`: a model repo of your own, from an empty folder.

Writes dodo.py, chips.toml (this repo's chip table), .gitignore (out/), models/ and in it models/mtcnn/ (the MTCNN
example: its weights come from the facenet-pytorch wheel, its images from scikit-image), from the package's data,
templates/repo/. The example lives there only: this repo's models/mtcnn is a link to templates/repo/models/mtcnn, so
what init writes is what this repo builds. The repo lists and builds as it is written: when the example's packages
are not installed, the example is left out (its model.toml names a checkpoint in one of them, which `doit list`
would refuse) and init says what to install; `--empty` leaves it out anyway. It refuses a folder that has anything
in it, naming what, so nothing of yours is overwritten.
"""
from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent / "templates" / "repo"
RENAMED = {"gitignore": ".gitignore"}  # package data leaves dot files out on some setuptools versions
EXAMPLE = Path("models/mtcnn")
EXAMPLE_PACKAGES = {"facenet_pytorch": "facenet-pytorch", "skimage": "scikit-image"}  # module -> distribution
EXAMPLE_NEEDS = "pip install --no-deps facenet-pytorch==2.6.0 && pip install scikit-image"
OWN_MODEL = ("Your own model: a folder models/<name>/ with a model.toml and a hooks file{like} (build_rules' "
             "README.md, 'A repo of your own'; every key: docs/model-toml.md){remove}")


class InitError(Exception):
    pass


def template_files() -> list[Path]:
    """The template's files, relative to it (no __pycache__: bytecode.py compiles the package, templates too)."""
    return sorted(p.relative_to(TEMPLATE) for p in TEMPLATE.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")


def missing_example_packages() -> list[str]:
    """The example's packages that are not installed (distribution names), found without importing them."""
    return [dist for module, dist in EXAMPLE_PACKAGES.items() if importlib.util.find_spec(module) is None]


def init(target: Path, example: bool = True) -> list[Path]:
    """Write the template into `target` (created if missing), the example model only when `example`; returns the
    files written."""
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise InitError(f"{target} is a file, not a folder")
    if target.is_dir():
        present = sorted(p.name + ("/" if p.is_dir() else "") for p in target.iterdir())
        if present:
            shown = ", ".join(present[:8]) + (f" and {len(present) - 8} more" if len(present) > 8 else "")
            raise InitError(f"{target} is not empty (it has {shown}): init writes only into an empty folder, so "
                            "that nothing of yours is overwritten; give a new folder, e.g. "
                            "`python -m build_rules init my-models`")
    files = template_files()
    if not files:
        raise InitError(f"{TEMPLATE}: the templates are missing from this install of build_rules; reinstall it")
    written = []
    (target / "models").mkdir(parents=True, exist_ok=True)  # where a model goes, example or not
    for rel in files:
        if not example and EXAMPLE in rel.parents:
            continue
        dest = target / rel.parent / RENAMED.get(rel.name, rel.name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(TEMPLATE / rel, dest)
        written.append(dest)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m build_rules init",
                                     description="Write dodo.py, chips.toml, models/ and the MTCNN example model "
                                                 "(when its packages are installed) into an empty folder: a model "
                                                 "repo of your own.")
    parser.add_argument("dir", nargs="?", type=Path, default=Path("."), help="the folder (default: the current one)")
    parser.add_argument("--empty", action="store_true", help="no example model: models/ is empty")
    args = parser.parse_args(argv)
    missing = [] if args.empty else missing_example_packages()
    example = not args.empty and not missing
    try:
        written = init(args.dir, example=example)
    except InitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    where = "" if args.dir == Path(".") else f"cd {args.dir} && "
    print()
    if example:
        print(f"Then: {where}doit list && doit -n 2 -P thread mtcnn  (builds the example, {EXAMPLE}/)")
        print(OWN_MODEL.format(like=f", as {EXAMPLE}/ is", remove=f"; remove {EXAMPLE}/ to build yours alone"))
        return 0
    if missing:
        print(f"left out the example model ({EXAMPLE}/): it needs {' and '.join(missing)}, not installed here "
              f"({EXAMPLE_NEEDS}; then `python -m build_rules init` into a new folder writes it)")
    print(f"Then: {where}doit list  (no model yet: it lists the stages and builds nothing)")
    print(OWN_MODEL.format(like="", remove=""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

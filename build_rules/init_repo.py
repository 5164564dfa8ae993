"""`python -m build_rules init [DIR]`: a model repo of your own, from an empty folder.

Writes dodo.py, chips.toml (this repo's chip table), .gitignore (out/) and models/mtcnn/ (the MTCNN example: its
weights come from the facenet-pytorch wheel, its images from scikit-image), from the package's data, templates/repo/.
The example lives there only: this repo's models/mtcnn is a link to templates/repo/models/mtcnn, so what init writes
is what this repo builds. It refuses a folder that has anything in it, naming what, so nothing of yours is
overwritten.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent / "templates" / "repo"
RENAMED = {"gitignore": ".gitignore"}  # package data leaves dot files out on some setuptools versions
EXAMPLE_NEEDS = "pip install --no-deps facenet-pytorch==2.6.0 && pip install scikit-image"


class InitError(Exception):
    pass


def template_files() -> list[Path]:
    """The template's files, relative to it (no __pycache__: bytecode.py compiles the package, templates too)."""
    return sorted(p.relative_to(TEMPLATE) for p in TEMPLATE.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")


def init(target: Path) -> list[Path]:
    """Write the template into `target` (created if missing); returns the files written."""
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
    for rel in files:
        dest = target / rel.parent / RENAMED.get(rel.name, rel.name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(TEMPLATE / rel, dest)
        written.append(dest)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m build_rules init",
                                     description="Write dodo.py, chips.toml and an example models/ folder into an "
                                                 "empty folder: a model repo of your own.")
    parser.add_argument("dir", nargs="?", type=Path, default=Path("."), help="the folder (default: the current one)")
    args = parser.parse_args(argv)
    try:
        written = init(args.dir)
    except InitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    where = "" if args.dir == Path(".") else f"cd {args.dir} && "
    print(f"\nThe example model (models/mtcnn) needs its weights and images: {EXAMPLE_NEEDS}\n"
          f"Then: {where}doit list && doit -n 2 -P thread mtcnn  (README.md: 'A repo of your own')")
    return 0


if __name__ == "__main__":
    sys.exit(main())

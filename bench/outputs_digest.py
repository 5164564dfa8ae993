"""A digest of every file under a repo's out/ (not a test): build before and after a change and compare the two
listings; byte-identical outputs give identical lines.

    python bench/outputs_digest.py REPO/out > digests.txt      # one line a file: sha256, size, path
    python bench/outputs_digest.py --compare A.txt B.txt       # the files that differ, are missing or are extra

Left out (they hold times, process ids or this machine's state, not build outputs): out/.build-state/ (doit's
journal, stat and key caches, the build log), out/.staging/ and out/.cache/ (the build cache's copies of outputs
listed anyway), every *.log (a stage's log holds its wall times), and __pycache__.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

SKIPPED_DIRS = {".build-state", ".staging", ".cache", "__pycache__"}
SKIPPED_SUFFIXES = (".log",)


def digests(out: Path):
    for folder, dirs, files in os.walk(out):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for name in sorted(files):
            if name.endswith(SKIPPED_SUFFIXES):
                continue
            path = Path(folder, name)
            data = path.read_bytes()
            yield hashlib.sha256(data).hexdigest(), len(data), path.relative_to(out).as_posix()


def read(listing: str) -> dict[str, str]:
    rows = {}
    for line in Path(listing).read_text().splitlines():
        digest, size, path = line.split("\t")
        rows[path] = f"{digest} {size}"
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--compare", action="store_true")
    args = parser.parse_args()
    if not args.compare:
        for digest, size, path in digests(Path(args.paths[0])):
            print(digest, size, path, sep="\t")
        return 0
    a, b = read(args.paths[0]), read(args.paths[1])
    differ = sorted(p for p in a.keys() & b.keys() if a[p] != b[p])
    for path in differ:
        print(f"differs: {path}")
    for path in sorted(a.keys() - b.keys()):
        print(f"only in {args.paths[0]}: {path}")
    for path in sorted(b.keys() - a.keys()):
        print(f"only in {args.paths[1]}: {path}")
    print(f"{len(a.keys() & b.keys()) - len(differ)} identical, {len(differ)} differ, "
          f"{len(a.keys() - b.keys())} + {len(b.keys() - a.keys())} only in one")
    return 1 if differ or a.keys() != b.keys() else 0


if __name__ == "__main__":
    sys.exit(main())

"""Compiled bytecode for build_rules itself, also where PYTHONDONTWRITEBYTECODE=1 is set.

Under that setting (some machines and container images set it for every process) Python writes no .pyc files, and
an editable install (`pip install -e`) has none to begin with: every doit load then compiles tasks.py, config.py
and the rest from source, ~25-40 ms of a ~150 ms no-op build, and every stage process compiles its own modules.
A regular `pip install` compiles the package at install time; here the first build that runs something does it,
once (later builds only compare timestamps, ~2 ms). Nothing else is written: not the user's dodo.py or hooks.
"""
from __future__ import annotations

import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent


def compile_package() -> None:
    if not sys.dont_write_bytecode:
        return  # Python writes the .pyc files itself as it imports the modules
    import compileall
    try:
        compileall.compile_dir(str(PACKAGE), quiet=2)
    except OSError:
        pass  # a read-only install: it works, only slower

"""Toolchains: which one builds this repo, and its identity for task keys.

- "ort-qnn": onnxruntime-qnn from PyPI (no SDK install).
- "qairt": the QAIRT SDK at $QNN_SDK_ROOT.
Each stage's generator and worker per toolchain are in stage_table.py (the qairt generators in tasks/qairt.py).

Choice, first match wins: $BUILD_RULES_TOOLCHAIN (per run), `toolchain = "..."` at the top of chips.toml
(per repo; "auto" is the default), then "qairt" when $QNN_SDK_ROOT is set, else "ort-qnn".
Light to import: only the chosen toolchain's identity() runs at doit load, from a cache file.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..config import ConfigError

ENV = "BUILD_RULES_TOOLCHAIN"
NAMES = ("ort-qnn", "qairt")


def choose(repo_default: str = "auto", environ=os.environ) -> tuple[str, str]:
    """(toolchain name, why it was chosen)."""
    asked = environ.get(ENV, "").strip()
    if asked:
        if asked not in NAMES:
            raise ConfigError(f"{ENV}={asked}: unknown toolchain (choose one of {', '.join(NAMES)})")
        return asked, f"{ENV}={asked}"
    if repo_default and repo_default != "auto":
        return repo_default, f'chips.toml: toolchain = "{repo_default}"'
    if environ.get("QNN_SDK_ROOT"):
        return "qairt", "QNN_SDK_ROOT is set"
    return "ort-qnn", "default (QNN_SDK_ROOT is not set)"


def identity(name: str, cache_dir: Path, qairt_flow: str = "model-lib") -> dict:
    """The toolchain's identity dict ({"name": ..., versions, build id}); raises ConfigError for a broken SDK.
    qairt_flow: chips.toml's choice ($BUILD_RULES_QAIRT_FLOW overrides it); that flow's tools are checked too."""
    if name == "qairt":
        from . import qairt
        flow = qairt.choose_flow(qairt_flow)
        return qairt.identity(qairt.find_sdk(flow=flow), cache_dir, flow)
    from . import ort_qnn  # looked up at call time: tests replace ort_qnn.identity
    return ort_qnn.identity(cache_dir)


def notes(ident: dict) -> list[str]:
    """Things the user should know about this toolchain's builds (shown in the build summary)."""
    if ident["name"] != "qairt":
        return []
    from . import qairt
    return qairt.notes(ident)

"""Toolchains: which one builds this repo, and its identity for task keys.

- "ort-qnn": onnxruntime-qnn from PyPI (no SDK install).
- "qairt": the QAIRT SDK at $QNN_SDK_ROOT.
Each stage's generator and worker per toolchain are in stage_table.py (the qairt generators in tasks/qairt.py).

Choice, first match wins: $BUILD_RULES_TOOLCHAIN (per run), `toolchain = "..."` at the top of chips.toml
(per repo; "auto", the default, is "ort-qnn"). Never because a runtime was found: QAIRT's envsetup.sh sets
$QNN_SDK_ROOT for everyone with the SDK, and the device tasks take the phone's runtime from it (device/runtime.py),
so an SDK on the machine does not recompile every binary with another toolchain (issue 37).
Light to import: only the chosen toolchain's identity() runs at doit load, from a cache file.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..configuration.config import ConfigError

ENV = "BUILD_RULES_TOOLCHAIN"
NAMES = ("ort-qnn", "qairt")


def choose(repo_default: str = "auto", environ=os.environ) -> tuple[str, str]:
    """(toolchain name, why it was chosen: the build's first line says both, summary.py)."""
    asked = environ.get(ENV, "").strip()
    if asked:
        if asked not in NAMES:
            raise ConfigError(f"{ENV}={asked}: unknown toolchain (choose one of {', '.join(NAMES)})")
        return asked, f"{ENV}={asked}"
    if repo_default and repo_default != "auto":
        return repo_default, f'chips.toml: toolchain = "{repo_default}"'
    if environ.get("QNN_SDK_ROOT"):
        return "ort-qnn", ("default; QNN_SDK_ROOT is set and used only for the phone's runtime -- "
                           f'toolchain = "qairt" in chips.toml or {ENV}=qairt builds with it')
    return "ort-qnn", "default"


def identity(name: str, cache_dir: Path, qairt_flow: str = "model-lib") -> dict:
    """The toolchain's identity dict ({"name": ..., versions, build id}); raises ConfigError for a broken SDK.
    qairt_flow: chips.toml's choice ($BUILD_RULES_QAIRT_FLOW overrides it); that flow's tools are checked too."""
    if name == "qairt":
        from . import qairt
        flow = qairt.choose_flow(qairt_flow)
        return qairt.identity(qairt.find_sdk(flow=flow), cache_dir, flow)
    from . import ort_qnn  # looked up at call time: tests replace ort_qnn.identity
    return ort_qnn.identity(cache_dir)


def line(ident: dict, why: str) -> str:
    """The build's one line on its toolchain: 'toolchain: ort-qnn (default)'."""
    what = ident["name"] + (f", {ident['flow']} flow" if ident.get("flow") else "")
    return f"toolchain: {what} ({why})"


def notes(ident: dict) -> list[str]:
    """Things the user should know about this toolchain's builds (shown in the build summary)."""
    if ident["name"] != "qairt":
        return []
    from . import qairt
    return qairt.notes(ident)

"""The installed version of a Python distribution, for task keys and manifests (a leaf: imports nothing of
build_rules, so the toolchains and the task generators can all ask it)."""
from __future__ import annotations

import functools
import importlib.metadata
import re


@functools.cache
def tool_version(package: str) -> str | None:
    # importlib.metadata.version() parses the whole METADATA file with the email parser (~1.5 ms a
    # package, on every doit load); a wheel's .dist-info folder is named <name>-<version>.dist-info, and
    # otherwise the version is in the file's first lines (torch's METADATA is 40 KB).
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        return None
    folder = getattr(dist, "_path", None)
    match = re.fullmatch(r"[^-]+-([^-]+)\.dist-info", folder.name) if folder is not None else None
    if match:
        return match.group(1)
    for line in (dist.read_text("METADATA") or dist.read_text("PKG-INFO") or "").splitlines():
        if line.startswith("Version:"):
            return line[len("Version:"):].strip()
        if not line:
            break
    return dist.version

"""Hides installed packages from a Python process, as if they were not installed, for tests of the paths without an
optional extra (AIMET) or an example's package (facenet_pytorch): a test puts this folder first on PYTHONPATH of a
subprocess and names the modules in HIDDEN_PACKAGES (space-separated). doit's stage processes inherit both. Then
`import <module>` fails with ModuleNotFoundError, importlib.util.find_spec(<module>) is None, and importlib.metadata
finds no distribution of that name (tool_versions.tool_version says None)."""
import importlib.metadata
import os
import re
import sys

HIDDEN = os.environ.get("HIDDEN_PACKAGES", "").split()


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


for _module in HIDDEN:
    sys.modules[_module] = None  # the import system's "not importable" marker

_distribution = importlib.metadata.distribution


def _hiding_distribution(name):
    if _normal(name) in {_normal(m) for m in HIDDEN}:
        raise importlib.metadata.PackageNotFoundError(name)
    return _distribution(name)


importlib.metadata.distribution = _hiding_distribution

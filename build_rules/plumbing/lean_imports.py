"""Import a package's submodules without running the package's __init__, where that __init__ imports torch for
tools the build never calls. Each stage is a process of its own, so an import is paid on every stage run:

- onnxsim 0.8's __init__ imports every tool it has, torch among them: 4.5 s of a 5 s simplify stage here;
  simplify() lives in onnxsim/onnx_simplifier.py in every version since 0.4. That module imports model_info, which
  imports sympy if it can, for the symbolic MAC counts of dynamic shapes in the model summaries onnxsim prints
  (sympy is optional to it: without it a dynamic dim counts as 1): 0.94 s of CPU of a tiny graph's 1.27 s simplify
  stage, for a summary the build never asks for (its shapes are static), so it is imported without sympy.
- onnxruntime/tools/__init__.py imports torch whenever torch is installed (for a PyTorch export helper), and the
  QNN quantization config (onnxruntime.quantization.execution_providers.qnn) imports onnxruntime.tools' model
  utilities: 2.2 s of every quantize and calibration_stats stage.
Once a stub is in place, a later `import onnxsim` in that process gets the stub: the stages call this after the
user's hooks have run (simplify's transform(model) hook imports the real package if it wants it).
"""
from __future__ import annotations

import contextlib
import importlib.util
import sys
import types


def skip_package_init(package: str) -> None:
    """Put an empty module with the package's search path in sys.modules: its submodules import as usual, its
    __init__ does not run. Nothing changes when the package is missing or already imported."""
    if package in sys.modules:
        return
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return
    module = types.ModuleType(package)
    module.__path__, module.__spec__, module.__file__ = list(spec.submodule_search_locations), spec, spec.origin
    module.__package__ = package
    module.lean_stub = True  # (forget() undoes only these)
    sys.modules[package] = module


def forget(package: str) -> None:
    """Undo skip_package_init (and the submodules imported since), so that a plain import runs the __init__."""
    if getattr(sys.modules.get(package), "lean_stub", False):
        for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
            del sys.modules[name]


def onnxsim_simplify():
    """onnxsim.simplify, imported without onnxsim's __init__ where its layout allows, else with it. (A process may
    call this more than once: the tests run stages in-process.)"""
    skip_package_init("onnxsim")
    try:
        with _hidden("sympy"):
            from onnxsim.onnx_simplifier import simplify
        return simplify
    except ImportError:
        forget("onnxsim")
    import onnxsim
    return onnxsim.simplify


@contextlib.contextmanager
def _hidden(name: str):
    """Within the block, `import <name>` raises ImportError unless it was imported already (sys.modules[name] = None);
    after it, the module imports as usual."""
    hid = name not in sys.modules
    if hid:
        sys.modules[name] = None
    try:
        yield
    finally:
        if hid and sys.modules.get(name, 0) is None:
            del sys.modules[name]


def onnxruntime_tools_without_torch() -> None:
    """Before importing onnxruntime.quantization.execution_providers.qnn: its onnxruntime.tools imports do not
    import torch (the submodules it uses need none)."""
    import onnxruntime  # noqa: F401  (the parent package itself is imported as usual)
    skip_package_init("onnxruntime.tools")

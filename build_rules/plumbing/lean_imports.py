"""Import a package's submodules without running the package's __init__ (or without some of its imports), where it
imports torch or another large package for tools the build never calls. Each stage is a process of its own, so an
import is paid on every stage run:

- onnxsim 0.8's __init__ imports every tool it has, torch among them: 4.5 s of a 5 s simplify stage here;
  simplify() lives in onnxsim/onnx_simplifier.py in every version since 0.4. That module imports model_info, which
  imports sympy if it can, for the symbolic MAC counts of dynamic shapes in the model summaries onnxsim prints
  (sympy is optional to it: without it a dynamic dim counts as 1): 0.94 s of CPU of a tiny graph's 1.27 s simplify
  stage, for a summary the build never asks for (its shapes are static), so it is imported without sympy.
- onnxruntime/tools/__init__.py imports torch whenever torch is installed (for a PyTorch export helper), and the
  QNN quantization config (onnxruntime.quantization.execution_providers.qnn) imports onnxruntime.tools' model
  utilities: 2.2 s of every quantize and calibration_stats stage.
- aimet_onnx's __init__ imports its sensitivity analyzer (scikit-learn) and its common.utils bokeh's server, both
  for plots: 1.4 s of its 2.4 s import in every aimet stage and tune (aimet_onnx() below: stand-ins while it imports).
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


def aimet_onnx():
    """aimet_onnx, imported without two of its imports that only tools the build never calls use: its __init__
    imports quant_analyzer (per-layer sensitivity plots, which import scikit-learn: 0.96 s) and its common.utils
    imports bokeh's server (to serve those plots live: 0.47 s), 1.4 s of its 2.4 s import here, in every aimet stage
    and tune. Stand-ins take their place while aimet_onnx imports; a call of the analyzer imports the real one, and
    bokeh imports as usual afterwards (its stand-ins are gone from sys.modules)."""
    if "aimet_onnx" in sys.modules:
        return sys.modules["aimet_onnx"]
    name = "aimet_onnx.quant_analyzer"
    analyzer = types.ModuleType(name)

    def real_analyzer():  # the stand-in gives way to the real module once its function is called
        if sys.modules.get(name) is analyzer:
            del sys.modules[name]
        return importlib.import_module(name)

    def analyze_per_layer_sensitivity(*args, **kwargs):  # what aimet_onnx's __init__ takes from it
        real = real_analyzer().analyze_per_layer_sensitivity
        sys.modules["aimet_onnx"].analyze_per_layer_sensitivity = real
        return real(*args, **kwargs)
    analyzer.analyze_per_layer_sensitivity = analyze_per_layer_sensitivity
    server, application = types.ModuleType("bokeh.server.server"), types.ModuleType("bokeh.application")
    server.Server = application.Application = _bokeh_server_not_loaded
    stand_ins = {name: analyzer, "bokeh.server.server": server, "bokeh.application": application}
    stand_ins = {n: module for n, module in stand_ins.items() if n not in sys.modules}
    sys.modules.update(stand_ins)
    try:
        import aimet_onnx
    finally:
        for n, module in stand_ins.items():  # the analyzer's stays while aimet_onnx does (it gives way when used)
            if sys.modules.get(n) is module and (n != name or "aimet_onnx" not in sys.modules):
                del sys.modules[n]
    return aimet_onnx


def _bokeh_server_not_loaded(*args, **kwargs):
    raise RuntimeError("aimet_onnx was imported without bokeh's server (build_rules.plumbing.lean_imports): the "
                       "build serves no plots")

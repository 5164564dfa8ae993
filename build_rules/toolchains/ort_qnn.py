"""The "ort-qnn" toolchain: ONNX -> Qualcomm QNN HTP context binaries with the PyPI package onnxruntime-qnn.

What it does:
- `identity()` names the exact toolchain for task keys: wheel version, QNN version and HTP backend build id.
- `quantize()` turns a float model into a QDQ model for HTP with onnxruntime.quantization.
- `compile_context_binary()` compiles a float or QDQ model offline for one Snapdragon SoC. It writes a raw QNN
  context binary `<graph>.bin` plus an EPContext model `<graph>_ctx.onnx` that points at it.
- `read_binary_target()` reads back which chip and VTCM size a binary was built for.
- `open_context_binary()` opens a compiled model on the x86 HTP emulator that ships in the wheel (stages run it
  through build_rules/emulator/emulator_runs.py: workers, the machine-wide limit, the output memo).

This module is imported when build files are loaded, and only `identity()` runs then. So onnxruntime, onnx and
numpy are imported inside the functions that need them, never at module level.
Measured facts behind the choices here are in shared/research/ort-qnn.md.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only for annotations; numpy is imported lazily
    import numpy as np

if __package__:  # (the compile child loads this file as a script, without its package: it needs none of this)
    from .qnn_binary import read_binary_target  # noqa: F401 -- ort_qnn.read_binary_target, as before
    # the float model after qnn_preprocess_model, and its tensors (ort_preprocess.py); ort_qnn.<name> as before
    from .ort_preprocess import _expose, _preprocessed, _tensor_names, preprocessed_model  # noqa: F401

NAME = "ort-qnn"

_DIST = "onnxruntime-qnn"  # distribution name on PyPI
_PKG = "onnxruntime_qnn"  # import name
_EP = "QNNExecutionProvider"
_INSTALL_HINT = "pip install onnxruntime-qnn"


class UnsupportedOpsError(Exception):
    """Nodes of a model that QNN HTP cannot run, so they would run on the CPU instead.

    `.nodes` is `[(op_type, node_name), ...]`. `.reasons` maps a node name to the EP's reason, where one is known.
    """

    def __init__(self, model: str | os.PathLike, nodes: list[tuple[str, str]],
                 reasons: dict[str, str] | None = None, partitions: int | None = None, log: list[str] | None = None):
        self.model = str(model)
        self.nodes = [(str(t), str(n)) for t, n in nodes]
        self.reasons = dict(reasons or {})
        self.partitions = partitions
        self.log = list(log or [])  # QNN's own error lines (qnn_errors.qnn_log_lines)
        listed = ", ".join(f"{t} (node '{n}')" for t, n in self.nodes)
        super().__init__(f"QNN HTP cannot run {len(self.nodes)} node(s) of {self.model}: {listed}")

    def __reduce__(self):
        # Build tools may run tasks in worker processes: keep the error picklable despite the custom __init__.
        return (type(self), (self.model, self.nodes, self.reasons, self.partitions, self.log))


class QnnCompileError(RuntimeError):
    """QNN refused the graph while composing or finalizing it; `.log` has QNN's own error lines, which name the node."""

    def __init__(self, message: str, log: list[str]):
        super().__init__(message)
        self.log = log


# --------------------------------------------------------------------------------------------------------------
# identity


def _not_installed(detail: str = "") -> ModuleNotFoundError:
    msg = f"the {NAME} toolchain needs the Python package onnxruntime-qnn, which is not installed"
    if detail:
        msg += f" ({detail})"
    return ModuleNotFoundError(f"{msg}: {_INSTALL_HINT}", name=_PKG)


def _package_dir() -> Path:
    # find_spec on a top-level package locates it without running its __init__ (which would be slow to import).
    spec = importlib.util.find_spec(_PKG)
    if spec is None or not spec.submodule_search_locations:
        raise _not_installed()
    return Path(list(spec.submodule_search_locations)[0])


def _htp_lib(pkg_dir: Path) -> Path:
    names = ("QnnHtp.dll",) if sys.platform == "win32" else ("libQnnHtp.so",)
    for name in names:
        if (pkg_dir / name).is_file():
            return pkg_dir / name
    # Some wheels keep their libraries in a platform sub-folder (see the package's optional platform_loader).
    for name in names:
        found = sorted(pkg_dir.rglob(name))
        if found:
            return found[0]
    raise _not_installed(f"no {names[0]} inside {pkg_dir}; reinstall it")


def _read_package_info(pkg_dir: Path) -> dict[str, str]:
    # Read build_and_package_info.py as text: importing the package would import its __init__.
    info_file = pkg_dir / "build_and_package_info.py"
    try:
        text = info_file.read_text(encoding="utf-8")
    except OSError as e:
        raise _not_installed(f"cannot read {info_file}: {e}") from e
    info = dict(re.findall(r"^\s*(\w+)\s*=\s*['\"]([^'\"]*)['\"]", text, re.M))
    if "qnn_version" not in info:
        raise RuntimeError(f"{info_file} has no qnn_version; unsupported onnxruntime-qnn layout")
    return info


def _probe_build_id(lib: Path) -> dict[str, Any]:
    """The ctypes probe lives in qnn_probe (the qairt toolchain uses it too). Imported here, not at the top:
    the compile child process loads this file by path, outside its package (see _compile_in_child)."""
    from .qnn_probe import probe_build_id
    return probe_build_id(lib)


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "build_rules"


_identity_memo: dict[tuple, dict] = {}
_identity_lock = threading.Lock()


def identity(cache_dir: Path | None = None) -> dict:
    """Toolchain identity for task keys.

    Returns {"name": "ort-qnn", "package_version": "2.7.0", "qnn_version": "2.51.0",
    "build_id": "v2.51.0.260929181845"}. It is cheap and never imports onnxruntime or onnxruntime_qnn. The build id
    comes from libQnnHtp.so once, and is then cached as JSON in `cache_dir`, keyed by the library's path, size and
    mtime. The default `cache_dir` is $XDG_CACHE_HOME/build_rules, or ~/.cache/build_rules.
    Raises ModuleNotFoundError when onnxruntime-qnn is not installed.
    """
    pkg_dir = _package_dir()
    from ..plumbing.tool_versions import tool_version  # METADATA's header only: importlib.metadata.version() reads it all
    package_version = tool_version(_DIST)
    if package_version is None:
        raise _not_installed(f"found {pkg_dir} but no installed distribution metadata")
    info = _read_package_info(pkg_dir)
    lib = _htp_lib(pkg_dir).resolve()
    st = lib.stat()
    key = {"lib": str(lib), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    cache_dir = Path(cache_dir) if cache_dir is not None else _default_cache_dir()
    memo_key = (str(cache_dir), key["lib"], key["size"], key["mtime_ns"])

    with _identity_lock:
        probe = _identity_memo.get(memo_key)
        if probe is None:
            digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
            cache_file = cache_dir / f"{NAME}-identity-{digest}.json"
            try:
                cached = json.loads(cache_file.read_text(encoding="utf-8"))
                if cached.get("key") == key and cached.get("probe", {}).get("build_id"):
                    probe = cached["probe"]
            except (OSError, ValueError, AttributeError):
                probe = None  # missing or corrupt cache: probe again
            if probe is None:
                probe = _probe_build_id(lib)
                _write_atomic(cache_file, json.dumps({"key": key, "probe": probe}, indent=1, sort_keys=True).encode())
            _identity_memo[memo_key] = probe

    return {"name": NAME, "package_version": package_version, "qnn_version": info["qnn_version"],
            "build_id": probe["build_id"]}


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        _unlink(Path(tmp))
        raise


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


# --------------------------------------------------------------------------------------------------------------
# onnxruntime plumbing

_register_lock = threading.Lock()
_registered = False


def _ort():
    """onnxruntime with the QNN EP plugin library registered (once per process)."""
    global _registered
    try:
        import onnxruntime as ort
    except ImportError as e:
        raise ModuleNotFoundError(f"the {NAME} toolchain needs onnxruntime: {_INSTALL_HINT}", name="onnxruntime") from e
    with _register_lock:
        if not _registered:
            # Another part of the process may have registered it already; a second registration raises.
            if not any(d.ep_name == _EP for d in ort.get_ep_devices()):
                try:
                    import onnxruntime_qnn
                except ImportError as e:
                    raise _not_installed() from e
                ort.register_execution_provider_library(_EP, onnxruntime_qnn.get_library_path())
            _registered = True
    return ort


def _qnn_session_options(ort, provider_options: dict[str, str]):
    devices = [d for d in ort.get_ep_devices() if d.ep_name == _EP]
    if not devices:
        raise RuntimeError(f"onnxruntime lists no {_EP} device after registering onnxruntime-qnn")
    so = ort.SessionOptions()
    so.log_severity_level = 3  # errors only: the EP's routine warnings are noise in build logs
    so.add_provider_for_devices(devices, provider_options)
    return so


# --------------------------------------------------------------------------------------------------------------
# quantize

_METHODS = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}


def _choice(kind: str, value: str, table: dict[str, str]) -> str:
    if value not in table:
        raise ValueError(f"unknown {kind} {value!r}; expected one of {', '.join(table)}")
    return table[value]


def quantize(float_model: Path, output: Path, calibration: list[dict[str, "np.ndarray"]], *, activations: str,
             weights: str, per_channel: bool, method: str = "minmax", overrides: dict[str, str] | None = None,
             node_overrides: dict[str, str] | None = None, ranges: Path | None = None,
             extra_outputs: list[str] | None = None, tied: list[tuple[str, str]] | None = None,
             weight_overrides: dict[str, str] | None = None) -> dict[str, str]:
    """Write a QDQ model for QNN HTP, using onnxruntime.quantization's QNN recipe.

    The recipe is qnn_preprocess_model, then get_qnn_qdq_config, then quantize.
    - activations: "uint8" | "uint16"
    - weights: "uint8" | "int8" | "uint16" | "int4" (with int8 and int4, LayerNormalization's scale stays uint8:
      HTP takes no signed weights there)
    - method: "minmax" | "entropy" | "percentile"
    - overrides: maps an activation tensor name to the type it should keep, e.g. {"conv3_out": "uint16"}.
      An unknown tensor name raises ValueError.
    - node_overrides: maps a node name to the type its output activations keep (same as naming each output).
    - ranges: tensor ranges written by calibration_ranges() for this float model and method; calibration is then
      not run again (`calibration` may be empty). The QDQ model is byte-identical to the one calibrated here.
    - extra_outputs: activation tensors to expose as additional graph outputs (per-tensor error profiles).
    - tied: pairs of tensors (a step graph's state output and the input it feeds) quantized with one scale and
      zero point, from the union of their calibrated ranges, so the app can copy the fixed-point output into the
      input. Both must be activations of the same type.
    - weight_overrides: maps a node name to the type of its weight (input 1; a Gather's table), e.g.
      {"Gemm_6": "int8"}. A Gather's table stays per-tensor.
    `output` appears only when it is complete. Returns node -> why for each weight kept at 8 bit under int4 weights
    because the HTP refuses it at int4 (block_quant.int4_refused; a weight override of the node wins).
    """
    from ..quantization.dtypes import TYPES  # here, not at the top: this file also runs as the compile child's script
    activation_types = {t.name: t.ort for t in TYPES if t.activation}
    act_name = _choice("activation type", activations, activation_types)
    wgt_name = _choice("weight type", weights, {t.name: t.ort for t in TYPES if t.weight})
    method_name = _choice("calibration method", method, _METHODS)
    override_names = {t: _choice(f"override type for tensor {t!r}", v, activation_types)
                      for t, v in (overrides or {}).items()}
    node_override_names = {n: _choice(f"override type for node {n!r}", v, activation_types)
                           for n, v in (node_overrides or {}).items()}
    calibration = list(calibration)
    if not calibration and ranges is None:
        raise ValueError("quantize() needs at least one calibration sample (or precomputed ranges)")
    if ranges is not None and not Path(ranges).is_file():
        raise ValueError(f"calibration ranges {ranges} not found")

    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantType, quantize_static

    from ..errors import did_you_mean  # here, not at the top: this file also runs as the compile child's script

    float_model, output = Path(float_model), Path(output)
    with tempfile.TemporaryDirectory(prefix="ort-qnn-quant-") as tmp:
        model, original_tensors = _preprocessed(float_model, Path(tmp))
        activations_known, initializers = _tensor_names(model)
        producers = {n.name: [o for o in n.output if o] for n in model.graph.node if n.name}
        for node, qtype in node_override_names.items():
            if node not in producers:
                raise ValueError(f"quantization override names unknown node {node!r}: {float_model} (after "
                                 f"qnn_preprocess_model) has no node of that name{did_you_mean(node, producers)}")
            for tensor in producers[node]:
                override_names.setdefault(tensor, qtype)
        for tensor in override_names:
            if tensor in activations_known:
                continue
            if tensor in initializers or tensor in original_tensors[1]:
                raise ValueError(f"quantization override names {tensor!r}, which is a weight/initializer of "
                                 f"{float_model}, not an activation tensor")
            if tensor in original_tensors[0]:
                raise ValueError(f"quantization override names tensor {tensor!r}, which qnn_preprocess_model removed "
                                 f"from {float_model} (it was fused away); override a neighbouring tensor instead")
            raise ValueError(f"quantization override names unknown tensor {tensor!r}: {float_model} has no such "
                             f"tensor{did_you_mean(tensor, activations_known)}")
        if extra_outputs:
            _expose(model, [t for t in extra_outputs if t in activations_known])

        from ..quantization import elementwise_constants as constants  # an element-wise op's constant: its type
        constants.split_shared(model, override_names, initializers, act_name)
        qnn_input = Path(tmp) / "input.onnx"
        onnx.save(model, str(qnn_input))
        init_overrides = {t: [{"quant_type": getattr(QuantType, q)}] for t, q in override_names.items()}
        init_overrides.update({c: [{"quant_type": getattr(QuantType, q)}] for c, q in
                               constants.like_their_node(model, override_names, initializers, act_name).items()})
        from ..quantization.block_quant import INT4_FALLBACK, int4_refused, weight_override_entries  # per-layer weight bits
        # Weights the HTP takes at no int4 stay 8 bit, unless the user's own weight override names the node
        kept = {} if weights != "int4" else {node: why for node, why in int4_refused(model, per_channel).items()
                                              if node not in (weight_overrides or {})}
        weight_overrides = {**{node: INT4_FALLBACK for node in kept}, **(weight_overrides or {})}
        for weight, (wtype, axis) in weight_override_entries(model, weight_overrides, per_channel, float_model).items():
            entry = {"quant_type": getattr(QuantType, _choice(f"weight override type of {weight!r}", wtype,
                                                                {t.name: t.ort for t in TYPES if t.weight}))}
            init_overrides[weight] = [{**entry, "axis": axis} if axis is not None else entry]
        if wgt_name in ("QInt8", "QInt4"):
            # HTP's LayerNormalization takes no signed weights (QNN error 0xc26 on every one: a transformer at int4
            # or int8 would not compile): its scale, a few hundred values, stays uint8
            for node in model.graph.node:
                if node.op_type == "LayerNormalization" and len(node.input) > 1 and node.input[1] in initializers:
                    init_overrides.setdefault(node.input[1], [{"quant_type": QuantType.QUInt8}])
        if tied:
            if ranges is None:  # the union of two ranges needs them before quantize_static calibrates
                ranges = Path(tmp) / "tied-ranges.json"
                calibration_ranges(float_model, ranges, calibration, method=method)
            from ..quantization.state_encodings import ort_ranges
            for tensor, entry in ort_ranges(model, tied, Path(ranges), override_names, act_name,
                                            activations_known).items():
                init_overrides[tensor] = [{**entry, "quant_type": getattr(QuantType, entry["quant_type"])}]
        reader = CalibrationReader(calibration) if calibration and ranges is None else None
        config = _qnn_config(str(qnn_input), reader, method_name, activation_type=getattr(QuantType, act_name),
                             weight_type=getattr(QuantType, wgt_name), per_channel=per_channel,
                             init_overrides=init_overrides or None)
        if config.use_external_data_format:
            # The external data file would be named after the temp file and break on rename.
            raise NotImplementedError(f"{float_model} needs external data (>= 2 GB); not supported by {NAME} quantize")
        cache = None
        if ranges is not None:
            # onnxruntime may rewrite a cache it finds inconsistent: give it a private copy, never our target.
            cache = Path(tmp) / "ranges.json"
            shutil.copyfile(ranges, cache)

        output.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_out = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".tmp.onnx", dir=output.parent)
        os.close(fd)
        try:
            quantize_static(
                str(qnn_input), tmp_out, config.calibration_data_reader,
                calibrate_method=getattr(CalibrationMethod, method_name), quant_format=config.quant_format,
                activation_type=config.activation_type, weight_type=config.weight_type,
                op_types_to_quantize=config.op_types_to_quantize, nodes_to_quantize=config.nodes_to_quantize,
                nodes_to_exclude=config.nodes_to_exclude, per_channel=config.per_channel,
                reduce_range=config.reduce_range, use_external_data_format=config.use_external_data_format,
                calibration_providers=config.calibration_providers, extra_options=config.extra_options,
                calibration_cache_path=str(cache) if cache else None)
            os.replace(tmp_out, output)
        except BaseException:
            _unlink(Path(tmp_out))
            raise
    return kept


def calibration_ranges(float_model: Path, output: Path, calibration: list[dict[str, "np.ndarray"]], *,
                       method: str = "minmax") -> dict:
    """Run the calibration pass once and write the tensor ranges (onnxruntime's TensorsData JSON) to `output`.

    The model is prepared exactly as quantize() prepares it, and the tensors and calibrator are the ones
    quantize_static would use; ranges do not depend on the activation or weight type (measured: the QDQ model from
    quantize(..., ranges=output) is byte-identical to the one calibrated inline, for u8/u16 activations,
    u8/i8 weights, overrides, and MinMax/Entropy/Percentile). Returns {"tensors": n, "samples": n}.
    """
    method_name = _choice("calibration method", method, _METHODS)
    calibration = list(calibration)
    if not calibration:
        raise ValueError("calibration_ranges() needs at least one calibration sample")
    import onnx
    from onnxruntime.quantization import CalibrationMethod
    from onnxruntime.quantization.calibrate import TensorsData, create_calibrator, save_tensors_data

    output = Path(output)
    with tempfile.TemporaryDirectory(prefix="ort-qnn-calib-") as tmp:
        model, _ = _preprocessed(Path(float_model), Path(tmp))
        qnn_input = Path(tmp) / "input.onnx"
        onnx.save(model, str(qnn_input))
        config = _qnn_config(str(qnn_input), None, method_name)
        calibrator = create_calibrator(qnn_input, config.op_types_to_quantize,
                                       augmented_model_path=str(Path(tmp) / "augmented.onnx"),
                                       calibrate_method=getattr(CalibrationMethod, method_name),
                                       use_external_data_format=config.use_external_data_format,
                                       providers=config.calibration_providers)
        reader = CalibrationReader(calibration)
        from ..plumbing import progress
        progress.watch(lambda: reader._next, "calibration samples", len(calibration))
        calibrator.collect_data(reader)
        tensors = calibrator.compute_data()
        del calibrator
        output.parent.mkdir(parents=True, exist_ok=True)
        # tensors in name order: the calibrator collects them in a run-dependent order, and the file's bytes (the
        # quantize tasks' input) should depend on the ranges alone
        tensors = TensorsData(tensors.calibration_method, dict(sorted(tensors.data.items())))
        save_tensors_data(tensors, output)  # writes a temp file beside, then renames
    return {"tensors": len(list(tensors.keys())), "samples": len(calibration)}


class CalibrationReader:
    """onnxruntime CalibrationDataReader over a list of input dicts (duck-typed: get_next, rewind, len)."""

    def __init__(self, samples):
        self._samples = samples
        self._next = 0

    def get_next(self):
        if self._next >= len(self._samples):
            return None
        self._next += 1
        return self._samples[self._next - 1]

    def rewind(self):
        self._next = 0

    def __len__(self):
        return len(self._samples)

    def __iter__(self):
        return iter(self._samples)


def _qnn_config(model_path: str, reader, method_name: str, **kwargs):
    from onnxruntime.quantization import CalibrationMethod

    from ..plumbing.lean_imports import onnxruntime_tools_without_torch  # here: the compile child loads this file on its own
    onnxruntime_tools_without_torch()
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config
    return get_qnn_qdq_config(model_path, reader, calibrate_method=getattr(CalibrationMethod, method_name), **kwargs)


def compile_options(soc_model: int, vtcm_mb: int, fp16: bool, block_quant: bool) -> dict[str, str]:
    """The QNN EP options that decide what a graph compiles to: one place, so a binary and the in-process session
    tune and diagnose measure (emulator_session) are the same graph. (Tune once measured a proposal with blocked
    int4 weights without the block option: the EP ran those layers in float16, and the build's LPBQ binary scored
    det_f1 0.03 where tune had measured 0.94.)"""
    options = {"soc_model": str(soc_model),  # soc_model alone fixes arch and VTCM size; htp_arch is not needed
               "vtcm_mb": str(vtcm_mb),
               "htp_graph_finalization_optimization_mode": "3",
               "enable_htp_fp16_precision": "1" if fp16 else "0"}
    if block_quant:
        options["enable_block_quant_weight_optimization"] = "1"
    return options


def emulator_session(model: bytes | Path, *, soc_model: int, vtcm_mb: int = 8, fp16: bool = False):
    """An onnxruntime session that runs a float or QDQ model on the x86 HTP emulator, compiled in-process for one SoC.

    For tuning loops: no context binary is written. Outputs equal those of the compiled context binary of the same
    model and SoC run with open_context_binary() (measured: max abs difference 0 on MTCNN O-Net, u8).
    CPU fallback is refused: every run is on QNNExecutionProvider.
    """
    ort = _ort()
    data = model if isinstance(model, bytes) else Path(model).read_bytes()
    block_quant = False
    if not fp16:  # blocked int4 weights compile to LPBQ only with the EP's block option, as compile sets it
        import onnx

        from ..quantization.block_quant import float_scale_blocks
        block_quant = float_scale_blocks(onnx.load_from_string(data))
    so = _qnn_session_options(ort, {"backend_type": "htp", **compile_options(soc_model, vtcm_mb, fp16, block_quant)})
    session = ort.InferenceSession(data, sess_options=so)
    session.disable_fallback()
    if session.get_providers()[0] != _EP:
        raise RuntimeError(f"the model did not load on {_EP}: providers {session.get_providers()}")
    return session


# --------------------------------------------------------------------------------------------------------------
# compile

_GRAPH_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def compile_context_binary(model: Path, out_dir: Path, graph: str, *, soc_model: int, vtcm_mb: int, fp16: bool,
                           trace_dir: Path | None = None, block_quant: bool = False, here: bool = False) -> dict:
    """Compile `model` (float or QDQ ONNX) into a QNN HTP context binary for one SoC.

    Writes out_dir/<graph>.bin, the raw QNN context binary, and out_dir/<graph>_ctx.onnx, an EPContext model whose
    ep_cache_context is "<graph>.bin". It writes nothing else to out_dir. On failure, earlier outputs of this graph
    are removed, so a stale binary never passes for a new one.
    block_quant: the model has blockwise weights with float block scales (block_quant.float_scale_blocks), which the
    EP turns into LPBQ only with enable_block_quant_weight_optimization.
    When `trace_dir` is given, the EP's op-support trace is kept as trace_dir/<graph>_qnn_op_trace.json, and this
    happens even when the compile fails.
    here: the caller is a process that ends after this (a compile stage): see _compile.
    Raises UnsupportedOpsError when any node except graph-input QuantizeLinear or graph-output DequantizeLinear would
    run on the CPU.
    Returns {"binary", "ctx_model", "seconds", "target", "ops": {"qnn": n, "cpu_io": [names]}, "float_ops",
    "weight_encodings"}: float_ops is what a quantized model runs in float (qnn_graph.float_ops), None for fp16;
    weight_encodings counts its weights by QNN quantization encoding (block_quant.compiled_weights).
    """
    model, out_dir = Path(model), Path(out_dir)
    if not _GRAPH_NAME.match(graph or ""):
        raise ValueError(f"bad graph name {graph!r}: use letters, digits, '_', '.', '-'")
    if isinstance(soc_model, bool) or not isinstance(soc_model, int) or soc_model <= 0:
        # Names like "QCS9100" are silently ignored by the EP (falls back to a v68 build), so insist on numbers.
        raise ValueError(f"soc_model must be a positive integer QNN SoC id (e.g. 43 for SM8550), got {soc_model!r}")
    if isinstance(vtcm_mb, bool) or not isinstance(vtcm_mb, int) or vtcm_mb < 0:
        raise ValueError(f"vtcm_mb must be an integer >= 0, got {vtcm_mb!r}")

    import onnx

    model_bytes = model.read_bytes()
    bin_path, ctx_path = out_dir / f"{graph}.bin", out_dir / f"{graph}_ctx.onnx"
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{graph}.compiling-", dir=out_dir))
    done = False
    try:
        trace_work = work / "trace"
        work_ctx = work / "model_ctx.onnx"
        provider_options = {
            "backend_type": "htp", **compile_options(soc_model, vtcm_mb, fp16, block_quant),
            # The op trace names every node the EP rejects; it does not change the binary's bytes.
            "enable_framework_op_trace": "1",
            "framework_op_trace_dir": str(trace_work),
        }
        if not fp16:  # the QNN graph as JSON: which ops still run in float (qnn_graph.py); the same binary bytes
            provider_options.update(dump_json_qnn_graph="1", json_qnn_graph_dir=str(work / "qnn_graph"))
        try:
            seconds, _ = _compile(model, work_ctx, provider_options, here)
        except _CompileFailed as failure:
            # E.g. ERROR_IF_NO_NODES_COMPILED on a model made only of unsupported ops: name them if the trace can.
            trace = _keep_trace(trace_work, trace_dir, graph)
            log = _qnn_log(model, work, provider_options)
            try:
                source = onnx.load_from_string(model_bytes)
            except Exception:
                raise QnnCompileError(f"onnxruntime-qnn could not compile {model}: {failure}", log) from None
            _, rejected, reasons, partitions = _placement(source, None, trace)
            if rejected:
                raise UnsupportedOpsError(model, rejected, reasons, partitions, log) from failure
            raise QnnCompileError(f"onnxruntime-qnn could not compile {model}: {failure}", log) from None
        trace = _keep_trace(trace_work, trace_dir, graph)

        source = onnx.load_from_string(model_bytes)
        ctx = onnx.load(str(work_ctx), load_external_data=False)
        cpu_io, rejected, reasons, partitions = _placement(source, ctx, trace)
        if rejected:
            raise UnsupportedOpsError(model, rejected, reasons, partitions, _qnn_log(model, work, provider_options))
        if partitions != 1:
            raise RuntimeError(f"compiling {model} produced {partitions} QNN partitions; exactly one is required")

        ep_node = next(n for n in ctx.graph.node if n.op_type == "EPContext")
        attrs = {a.name: a for a in ep_node.attribute}
        if attrs["embed_mode"].i != 0:
            raise RuntimeError("expected an external context binary (embed_mode 0)")
        work_bin = work / attrs["ep_cache_context"].s.decode()
        target = read_binary_target(work_bin)
        from .qnn_graph import float_ops as graph_float_ops, read_dump  # not `from . import`: an import circle
        dump = None if fp16 else read_dump(work / "qnn_graph")
        float_ops = None if fp16 else graph_float_ops(source, dump)
        from ..quantization.block_quant import compiled_weights  # which weights the HTP runs as LPBQ (block_quant.py)
        weights = compiled_weights(dump)
        if target["soc_type"].startswith("UNKNOWN"):
            raise RuntimeError(f"compiling {model} gave a {target['soc_type']} binary: soc_model {soc_model} "
                               "was not applied")
        # Point the EPContext node at the final, graph-named binary (relative to the ctx model).
        attrs["ep_cache_context"].s = bin_path.name.encode()
        work_ctx.write_bytes(ctx.SerializeToString())

        # Binary first, then the ctx model: a ctx model on disk always has its binary next to it.
        os.replace(work_bin, bin_path)
        os.replace(work_ctx, ctx_path)
        done = True
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if not done:
            _unlink(bin_path)
            _unlink(ctx_path)

    source_nodes = len(source.graph.node)
    return {"binary": bin_path, "ctx_model": ctx_path, "seconds": seconds, "target": target,
            "ops": {"qnn": source_nodes - len(cpu_io), "cpu_io": cpu_io}, "float_ops": float_ops,
            "weight_encodings": weights}


class _CompileFailed(Exception):
    """onnxruntime refused to compile (an exception inside the compile process, not a crash)."""

    def __init__(self, message: str, stderr: str = ""):
        super().__init__(message)
        self.stderr = stderr


def _qnn_log(model: Path, work: Path, provider_options: dict[str, str]) -> list[str]:
    """QNN's error lines for a compile that failed. onnxruntime prints them only at verbose level, so the failed
    compile runs once more with that on: the failing path only, the binaries are compiled with the log off."""
    from .qnn_errors import qnn_log_lines
    options = {k: v for k, v in provider_options.items() if "op_trace" not in k and "json_qnn_graph" not in k}
    try:
        _, stderr = _compile_in_child(model, work / "qnn_log_ctx.onnx", options, verbose=True)
    except _CompileFailed as failure:
        stderr = failure.stderr
    except RuntimeError:
        return []  # the process died: the caller's own error says so
    return qnn_log_lines(stderr)


_CHILD_MARK = "ORT_QNN_COMPILE_JSON "


def _compile(model: Path, ctx_out: Path, provider_options: dict[str, str], here: bool) -> tuple[float, str]:
    """_compile_in_child, or (here: the caller's process ends after its task) the same compile in this process when
    no QNN is loaded in it yet: as byte-stable as the child's first compile, without the child's start (~0.26 s of
    CPU of a tiny graph's 0.34 s compile stage). A native crash then ends the stage: the task fails either way."""
    if not here or _qnn_loaded():
        return _compile_in_child(model, ctx_out, provider_options)
    from ..plumbing.native_stderr import captured
    with captured() as lines:  # QNN's own lines, as the child's stderr: kept for a failure, else dropped
        reply = _compile_now({"model": str(model), "ctx": str(ctx_out), "options": provider_options})
    if "error" in reply:
        raise _CompileFailed(reply["error"], "\n".join(lines))
    return float(reply["seconds"]), "\n".join(lines)


def _qnn_loaded() -> bool:
    """Whether QNN's libraries (a session, a compile) or the EP's own (registered) are mapped into this process."""
    try:  # (no /proc: assume the worst)
        return any(name in Path("/proc/self/maps").read_text() for name in ("/libQnn", "onnxruntime_providers_qnn"))
    except OSError:
        return True


def _compile_in_child(model: Path, ctx_out: Path, provider_options: dict[str, str],
                      verbose: bool = False) -> tuple[float, str]:
    """Run the ModelCompiler in a fresh Python process: (seconds the compile itself took, the process's stderr).
    verbose: onnxruntime's log at verbose level, which is where QNN's own messages go.

    Why a process per compile:
    - Determinism. The HTP backend keeps state between compiles in one process: every further compile of the same
      model in the same process gives different .bin bytes (measured: PICKLE/256, 258, ... records). The first
      compile in a fresh process is byte-stable; so is one in a child of the fork server, which never loads QNN.
    - Isolation. A native crash in the 100 MB QNN libraries cannot take the build tool down, and the
      compiler's memory goes back to the system.
    """
    request = json.dumps({"model": str(model), "ctx": str(ctx_out), "options": provider_options, "verbose": verbose})
    # Load this very file in the child (not "import build_rules..."), so it works wherever the package lives.
    code = ("import importlib.util as u, sys; s = u.spec_from_file_location('_ort_qnn_compile_child', sys.argv[1]); "
            "m = u.module_from_spec(s); s.loader.exec_module(m); m._compile_child()")
    from ..plumbing import fork_server
    proc = fork_server.run(["-c", code, str(Path(__file__).resolve())], input=request)  # fresh: no QNN state
    reply = None
    for line in proc.stdout.splitlines():
        if line.startswith(_CHILD_MARK):
            reply = json.loads(line[len(_CHILD_MARK):])
    if reply is None or proc.returncode != 0 and "error" not in reply:
        raise RuntimeError(f"the onnxruntime-qnn compile process for {model} died (exit code {proc.returncode}): "
                           f"{(proc.stderr or proc.stdout).strip()[-3000:]}")
    if "error" in reply:
        raise _CompileFailed(reply["error"], proc.stderr)
    return float(reply["seconds"]), proc.stderr


def _compile_child() -> None:
    """Body of the compile process: read the request from stdin, compile, report one JSON line on stdout."""
    print("\n" + _CHILD_MARK + json.dumps(_compile_now(json.loads(sys.stdin.read()))), flush=True)


def _compile_now(request: dict) -> dict:
    """Compile request["model"] to request["ctx"] here: {"seconds": the compile's own} or {"error": its text}."""
    try:
        if request.get("verbose"):  # before the EP library is registered: it takes the level then
            import onnxruntime
            onnxruntime.set_default_logger_severity(0)
        ort = _ort()
        # CPU fallback stays allowed on purpose: only then does the EP offload graph-I/O Q/DQ to the CPU, so the
        # binary's own I/O is 16-bit fixed point (what sherpa-onnx expects). The parent polices the CPU nodes.
        so = _qnn_session_options(ort, request["options"])
        # Compile from bytes: given a path, the QNN graph name inside the .bin hashes the path string.
        model_bytes = Path(request["model"]).read_bytes()
        started = time.perf_counter()
        compiler = ort.ModelCompiler(so, model_bytes, embed_compiled_data_into_model=False,
                                     flags=ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED)
        compiler.compile_to_file(request["ctx"])
        return {"seconds": time.perf_counter() - started}
    except Exception as e:  # reported to the caller, which raises with context
        return {"error": f"{type(e).__name__}: {e}"}


def _keep_trace(trace_work: Path, trace_dir: Path | None, graph: str) -> dict:
    trace_file = trace_work / "qnn_op_trace.json"
    if not trace_file.is_file():
        return {}
    if trace_dir is not None:
        Path(trace_dir).mkdir(parents=True, exist_ok=True)
        _write_atomic(Path(trace_dir) / f"{graph}_qnn_op_trace.json", trace_file.read_bytes())
    try:
        return json.loads(trace_file.read_text(encoding="utf-8"))
    except ValueError:
        return {}


def _placement(source, ctx, trace: dict):
    """Split the compiled model's nodes into allowed CPU I/O Q/DQ nodes and rejected ones.

    Two sources are combined, because neither is complete on its own:
    - The op trace lists the nodes the EP refused, with reasons.
    - The compiled model shows what really ended up outside QNN. A lone Q/DQ left next to a rejected op is
      missing from the trace.
    The trace names nodes of the layout-transformed graph: an output DQ can be re-created there under a new
    name (e.g. "DequantizeLinear_token_67" after a Transpose was pushed through it). So a traced Q/DQ is judged
    by where it sits in the compiled model, and otherwise by the source model.
    Returns (cpu_io_names, rejected [(op_type, name)], reasons {name: reason}, partition_count).
    """
    def is_io_qdq(node, graph_inputs, graph_outputs) -> bool:
        if node.op_type == "QuantizeLinear":
            return bool(node.input) and node.input[0] in graph_inputs
        if node.op_type == "DequantizeLinear":
            return bool(node.output) and node.output[0] in graph_outputs
        return False

    cpu_io: list[str] = []
    rejected: list[tuple[str, str]] = []
    reasons: dict[str, str] = {}
    ctx_in = {i.name for i in ctx.graph.input} if ctx is not None else set()
    ctx_out = {o.name for o in ctx.graph.output} if ctx is not None else set()
    partitions = 0
    for node in ctx.graph.node if ctx is not None else []:
        if node.op_type == "EPContext":
            partitions += 1
        elif is_io_qdq(node, ctx_in, ctx_out):
            cpu_io.append(node.name)
        else:
            rejected.append((node.op_type, node.name))

    src_nodes = {n.name: n for n in source.graph.node if n.name}
    src_in = {i.name for i in source.graph.input}
    src_out = {o.name for o in source.graph.output}
    seen = {name for _, name in rejected}
    for entry in trace.get("unsupported_nodes", []):
        name, op_type = entry.get("node_name", ""), entry.get("op_type", "")
        reasons[name] = entry.get("reason", "")
        if name in cpu_io:
            continue  # seen in the compiled model as a graph-I/O Q/DQ on the CPU
        node = src_nodes.get(name)
        if node is not None and is_io_qdq(node, src_in, src_out):
            continue
        if name not in seen:
            rejected.append((op_type, name))
            seen.add(name)
    partitions = max(partitions, int(trace.get("summary", {}).get("qnn_subgraphs", 0) or 0))
    return cpu_io, rejected, {n: r for n, r in reasons.items() if n in seen}, partitions


# --------------------------------------------------------------------------------------------------------------
# run on the x86 HTP emulator


def open_context_binary(ctx_model: Path):
    """A function feed -> {output name: array} that runs a compiled EPContext model on the x86 HTP
    emulator (QNN EP). One session, many runs: for loops like greedy decoding."""
    ort = _ort()
    import onnx

    ctx_model = Path(ctx_model)
    ctx = onnx.load(str(ctx_model), load_external_data=False)
    if not any(n.op_type == "EPContext" for n in ctx.graph.node):
        raise ValueError(f"{ctx_model} is not an EPContext model (no EPContext node); compile it first")

    # CPU fallback must stay allowed: the graph-I/O Q/DQ nodes of the ctx model run on the CPU EP by design.
    so = _qnn_session_options(ort, {"backend_type": "htp"})
    session = ort.InferenceSession(str(ctx_model), sess_options=so)
    # InferenceSession.run() would otherwise catch an EP failure and silently retry on the CPU EP alone.
    session.disable_fallback()
    if session.get_providers()[0] != _EP:
        raise RuntimeError(f"{ctx_model} did not load on {_EP}: providers {session.get_providers()}")
    names = [o.name for o in session.get_outputs()]

    def run(feed: dict) -> dict:
        values = session.run(names, feed)
        if session.get_providers()[0] != _EP:  # belt and braces: a retry would have replaced the providers
            raise RuntimeError(f"{ctx_model} fell back to {session.get_providers()} while running")
        return dict(zip(names, values))

    return run

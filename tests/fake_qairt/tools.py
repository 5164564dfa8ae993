"""The stand-in QAIRT command-line tools (see make_sdk.py).

Each main_* parses its arguments with the real tool's flag names and arity (a subset: the ones a build could pass,
taken from the tools' published --help texts), fails like the real tool on a missing input, and writes outputs a
test can recognise; where the build reads an output, in the real format (_net.json as onnxruntime's
tools/qnn/gen_qnn_ctx_onnx_model.py reads it; qnn-context-binary-utility's JSON as published dumps of it look).
Before anything, every tool checks the environment the real one needs: $SDK/bin/x86_64-linux-clang on PATH,
$SDK/lib/x86_64-linux-clang on LD_LIBRARY_PATH (libQnnHtp.so loads libQnnHtpPrepare.so by name), and for the
Python tools qti.aisw importable from $SDK/lib/python (PYTHONPATH). Every call is appended to $FAKE_QAIRT_LOG as
one JSON line: {"tool", "argv", "cwd", "LDFLAGS", "QNN_SDK_ROOT"}.

What they print follows published logs: converter lines `<time> - <line> - WARNING - ...` (harmless, and some say
"not supported"), `ERROR - Node <name>: 'No translation registered for op type onnx_<op>.'`; the context-binary
generator's `<E> ... / <E> Failed to validate op <node> with error 0xc26` (plus the addNode line of a model library).
HTP rules the generator enforces: a model with 16-bit activations has no MatMul/FullyConnected on v68/v69 unless
its weights were quantized per row (`has incorrect Value 68, expected >= 73.`).

Test switches (environment):
  FAKE_QAIRT_UNSUPPORTED_OP=<OnnxOp>  the converters cannot translate that op
  FAKE_QAIRT_REJECT_OP=<OnnxOp>       the context-binary generator's HTP validation rejects that op
  FAKE_QAIRT_WARNING=1                the converter and the quantizer print a quantization warning
  FAKE_QAIRT_KEEP_LAYOUT=1            qnn-onnx-converter keeps every input's ONNX layout (a converter that
                                      behaves unlike the build assumes)
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import re
import shutil
import sys
from pathlib import Path

SOC_NAMES = {30: "SM8350", 35: "SM7325", 36: "SM8450", 39: "SA8295", 42: "SM8475", 43: "SM8550", 52: "SA8255", 57: "SM8650",
             69: "SM8750", 77: "QCS9100", 87: "SM8850"}
LAYOUTS = ("NCDHW", "NDHWC", "NCHW", "NHWC", "NFC", "NCF", "NTF", "TNF", "NF", "NC", "F", "NONTRIVIAL")
CHANNEL_LAST = {"NCF": (0, 2, 1), "NCHW": (0, 2, 3, 1), "NCDHW": (0, 2, 3, 4, 1)}
CHANNEL_LAST_NAME = {"NCF": "NFC", "NCHW": "NHWC", "NCDHW": "NDHWC"}
DEFAULT_LAYOUT = {1: "F", 2: "NF", 3: "NCF", 4: "NCHW", 5: "NCDHW"}
TARGETS = ("x86_64-linux-clang", "aarch64-android")
DTYPES = ("float32", "float16", "int32", "uint8", "int8", "bool")
# Qnn_DataType_t codes (QnnTypes.h)
INT_32, FLOAT_16, FLOAT_32, UFIXED_8, UFIXED_16, BOOL_8 = 0x0032, 0x0216, 0x0232, 0x0408, 0x0416, 0x0508
TYPE_NAMES = {INT_32: "INT_32", FLOAT_16: "FLOAT_16", FLOAT_32: "FLOAT_32", UFIXED_8: "UFIXED_POINT_8",
              UFIXED_16: "UFIXED_POINT_16", BOOL_8: "BOOL_8", 0x0108: "UINT_8", 0x0008: "INT_8"}
ONNX_TYPES = {"float32": FLOAT_32, "float16": FLOAT_16, "int32": INT_32, "bool": BOOL_8, "uint8": 0x0108,
              "int8": 0x0008}
QNN_OPS = {"Gemm": "FullyConnected", "MatMul": "MatMul", "Conv": "Conv2d", "Relu": "ElementWiseNeuron",
           "Add": "ElementWiseAdd", "Flatten": "Reshape", "Reshape": "Reshape", "Slice": "StridedSlice"}
PYTHON_TOOLS = ("qnn-onnx-converter", "qairt-converter", "qairt-quantizer")
UNDEFINED = 0x7FFFFFFF
STAND_IN_DLC = b"STAND-IN DLC\n"
STAND_IN_BINARY = b"STAND-IN QNN CONTEXT BINARY\0"


class Fail(Exception):
    pass


def _parser(prog: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=prog, allow_abbrev=False)


def _record(tool: str, argv: list[str]) -> None:
    log = os.environ.get("FAKE_QAIRT_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"tool": tool, "argv": argv, "cwd": os.getcwd(), "LDFLAGS": os.environ.get("LDFLAGS"),
                                "QNN_SDK_ROOT": os.environ.get("QNN_SDK_ROOT")}) + "\n")


def _sdk_version(sdk: Path) -> tuple[int, ...]:
    text = (sdk / "sdk.yaml").read_text() if (sdk / "sdk.yaml").exists() else f"version: {sdk.name}"
    return tuple(int(p) for p in re.search(r"^version:\s*([\d.]+)", text, re.M).group(1).split(".")[:3])


def _check_env(tool: str, sdk: Path) -> None:
    """What the real tool needs from its environment, or it fails the way the real one would."""
    bin_dir, lib_dir = sdk / "bin" / "x86_64-linux-clang", sdk / "lib" / "x86_64-linux-clang"
    if str(bin_dir) not in os.environ.get("PATH", "").split(os.pathsep):
        raise Fail(f"{tool}: {bin_dir} is not on PATH (the SDK's tools call each other by name; "
                   "bin/envsetup.sh puts it there)")
    if str(lib_dir) not in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep):
        raise Fail(f"{tool}: error while loading shared libraries: libQnnHtpPrepare.so: cannot open shared object "
                   "file: No such file or directory")
    if tool in PYTHON_TOOLS:
        try:
            import qti.aisw
        except ModuleNotFoundError as e:
            raise Fail(f"Traceback (most recent call last):\n  File \"{tool}\", line 12, in <module>\n"
                       f"    from qti.aisw.converters.common import ir_graph\nModuleNotFoundError: {e}") from None
        if not Path(qti.aisw.__file__).resolve().is_relative_to((sdk / "lib" / "python").resolve()):
            raise Fail(f"{tool}: imported qti.aisw from {qti.aisw.__file__}, not from this SDK's lib/python")
    if tool == "qnn-model-lib-generator" and os.environ.get("QNN_SDK_ROOT") != str(sdk):
        raise Fail("ERROR: QNN_SDK_ROOT is not set to this SDK (the generated Makefile includes "
                   "$QNN_SDK_ROOT/include/QNN)")


def _existing(path: str, what: str) -> Path:
    if not Path(path).is_file():
        raise Fail(f"ERROR - {what} {path} does not exist")
    return Path(path)


def _qnn_name(name: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return f"_{name}" if name[:1].isdigit() else name


def _log(level: str, line: int, message: str) -> None:
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
    print(f"{stamp} - {line} - {level} - {message}", flush=True)


def _two_hex(value: str) -> tuple[int, int]:
    """--restrict_quantization_steps "MIN MAX": one argument, two hexadecimal numbers separated by a space."""
    parts = value.split()
    if len(parts) != 2 or not all(re.fullmatch(r"-?0x[0-9A-Fa-f]+", p) for p in parts):
        raise argparse.ArgumentTypeError(f"expected \"MIN MAX\" as two hexadecimal numbers, got {value!r}")
    return int(parts[0], 16), int(parts[1], 16)


def _add_quantizer_flags(p: argparse.ArgumentParser) -> None:
    """The quantizer options qnn-onnx-converter and qairt-quantizer share (names and choices from their --help)."""
    p.add_argument("--act_bitwidth", type=int, choices=(8, 16))
    p.add_argument("--weights_bitwidth", type=int, choices=(4, 8, 16))
    p.add_argument("--bias_bitwidth", type=int, choices=(8, 32))
    p.add_argument("--float_bitwidth", type=int, choices=(16, 32))
    p.add_argument("--float_bias_bitwidth", type=int, choices=(16, 32))
    p.add_argument("--param_quantizer_schema", choices=("asymmetric", "symmetric", "unsignedsymmetric"))
    p.add_argument("--act_quantizer_schema", choices=("asymmetric", "symmetric", "unsignedsymmetric"))
    p.add_argument("--act_quantizer_calibration", choices=("min-max", "sqnr", "entropy", "mse", "percentile"))
    p.add_argument("--param_quantizer_calibration", choices=("min-max", "sqnr", "entropy", "mse", "percentile"))
    p.add_argument("--percentile_calibration_value", type=float)
    p.add_argument("--use_per_channel_quantization", action="store_true")
    p.add_argument("--use_per_row_quantization", action="store_true")
    p.add_argument("--enable_per_row_quantized_bias", action="store_true")
    p.add_argument("--restrict_quantization_steps", type=_two_hex)
    p.add_argument("--use_native_input_files", action="store_true")
    p.add_argument("--use_native_output_files", action="store_true")
    p.add_argument("--input_list")


def _check_quantizer_flags(args) -> None:
    if args.restrict_quantization_steps:
        low, high = args.restrict_quantization_steps
        bits = args.weights_bitwidth or 8
        if high - low + 1 > 2 ** bits:
            raise Fail(f"ERROR - Cannot restrict quantization steps to {low} - {high} for bitwidth: {bits}")
        if args.param_quantizer_schema != "symmetric" and not (args.use_per_channel_quantization or
                                                               args.use_per_row_quantization):
            _log("WARNING", 312, "Restrict_quantization_steps is only supported for --param_quantizer = symmetric "
                                 "or per channel/row quantization. Value will be ignored.")
    if os.environ.get("FAKE_QAIRT_WARNING"):
        _log("WARNING", 427, "Quantization encodings of tensor 'stand_in_tensor' were clipped to the calibrated range")


# --------------------------------------------------------------------------------------------------------------
# the model: ONNX facts, calibration data, encodings

def _load_onnx(path: str):
    import onnx
    model = onnx.load(str(_existing(path, "input network")))
    initializers = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    return model, inputs


def _dims(value_info) -> list[int]:
    return [d.dim_value for d in value_info.type.tensor_type.shape.dim]


def _onnx_dtype(value_info) -> str:
    import onnx
    return onnx.helper.tensor_dtype_to_np_dtype(value_info.type.tensor_type.elem_type).name


def _unsupported(model) -> bool:
    """FAKE_QAIRT_UNSUPPORTED_OP: report it as the real converters do, and fail."""
    unsupported = os.environ.get("FAKE_QAIRT_UNSUPPORTED_OP")
    node = next((n for n in model.graph.node if n.op_type == unsupported), None)
    if node is None:
        return False
    _log("ERROR", 235, f"Node {node.name}: 'No translation registered for op type onnx_{unsupported.lower()}.'")
    _log("ERROR", 236, "Conversion FAILED!")
    return True


def _warnings(model) -> None:
    """Real converters print WARNING lines that mention unsupported things; a build must not fail on them."""
    for node in model.graph.node:
        if node.op_type == "Gemm":
            _log("WARNING", 240, "WARNING_GEMM: GEMM operation is not supported in the general case, attempting to "
                                 "interpret as FC")
            break


def _nodes(model) -> list[dict]:
    return [{"name": _qnn_name(n.name or f"{n.op_type}_{i}"), "onnx_name": n.name, "type": QNN_OPS.get(n.op_type, n.op_type),
             "onnx_type": n.op_type} for i, n in enumerate(model.graph.node)]


def _read_input_list(path: str, inputs: list[dict], native: bool) -> list[dict]:
    """Samples of an input list (positional paths, or `name:=path`), each {input name: array in the list's layout}.
    inputs: [{"name", "dims", "dtype"}] in graph order; names may be given as the ONNX or the QNN name."""
    import numpy as np
    lines = [line.split() for line in _existing(path, "input list").read_text().splitlines()
             if line.strip() and not line.startswith(("#", "%"))]
    if not lines:
        raise Fail(f"ERROR - input list {path} is empty")
    by_name = {}
    for spec in inputs:
        by_name[spec["name"]] = spec
        by_name.setdefault(spec.get("onnx_name", spec["name"]), spec)
    samples = []
    for line in lines:
        if any(":=" in token for token in line):
            pairs = [token.split(":=", 1) for token in line]
            unknown = [n for n, _ in pairs if n not in by_name]
            if unknown or len(pairs) != len(inputs):
                raise Fail(f"ERROR - input list line {line}: names {unknown or [n for n, _ in pairs]} do not match "
                           f"the graph's inputs {[s['name'] for s in inputs]}")
            chosen = [(by_name[n], p) for n, p in pairs]
        else:
            if len(line) != len(inputs):
                raise Fail(f"ERROR - input list line {line} has {len(line)} files, the graph has {len(inputs)} inputs")
            chosen = list(zip(inputs, line))
        sample = {}
        for spec, file in chosen:
            dtype = np.dtype(spec["dtype"]) if native else np.dtype(np.float32)
            expected = dtype.itemsize * math.prod(spec["dims"])
            size = _existing(file, "input file").stat().st_size
            if size != expected:
                raise Fail(f"ERROR - {file}: {size} bytes, input {spec['name']} {spec['dims']} needs {expected} "
                           f"({'native ' + dtype.name if native else 'float32'})")
            sample[spec["name"]] = np.fromfile(file, dtype=dtype).reshape(spec["dims"])
        samples.append(sample)
    return samples


def _encoding(arrays: list, bits: int) -> dict:
    """QNN's asymmetric min-max encoding: real = scale * (q + offset), the range widened to hold 0."""
    import numpy as np
    low = min(0.0, min(float(np.min(a)) for a in arrays))
    high = max(0.0, max(float(np.max(a)) for a in arrays))
    scale = (high - low) / (2 ** bits - 1) or 1e-8
    return {"scale": scale, "offset": int(round(low / scale))}


def _cpu_session(source: str):
    """The stand-in binary's ONNX source on onnxruntime's CPU, one thread: a stand-in's graph is small, and more
    threads only spun (2.7x the CPU, no faster)."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(source, sess_options=options, providers=["CPUExecutionProvider"])


def _run_onnx(source: str, feeds: list[dict]) -> list[dict]:
    session = _cpu_session(source)
    names = [o.name for o in session.get_outputs()]
    return [dict(zip(names, session.run(None, feed))) for feed in feeds]


def _onnx_feed(meta: dict, sample: dict) -> dict:
    """A sample keyed by QNN input name, in QNN layout -> the ONNX model's feed."""
    import numpy as np
    feed = {}
    for t in meta["inputs"]:
        array = sample[t["name"]]
        if t.get("perm"):
            array = array.transpose(np.argsort(t["perm"]))
        feed[t["onnx_name"]] = array.astype(t["onnx_dtype"])
    return feed


def _quantize_io(meta: dict, samples: list[dict], act_bits: int) -> None:
    """Give float I/O tensors the fixed-point type and min-max encodings of the calibration data."""
    import numpy as np
    outputs = _run_onnx(meta["source"], [_onnx_feed(meta, s) for s in samples])
    fixed = UFIXED_16 if act_bits == 16 else UFIXED_8
    for t in meta["inputs"]:
        if t["data_type"] in (FLOAT_32, FLOAT_16):
            t["data_type"], t["quant"] = fixed, _encoding([s[t["name"]] for s in samples], act_bits)
    for t in meta["outputs"]:
        if t["data_type"] in (FLOAT_32, FLOAT_16):
            values = [o[t["onnx_name"]] for o in outputs]
            values = [np.asarray(v).transpose(t["perm"]) if t.get("perm") else v for v in values]
            t["data_type"], t["quant"] = fixed, _encoding(values, act_bits)


def _graph_meta(model, onnx_path: Path, graph: str, inputs, perms: dict, float_type: int) -> dict:
    """What the stand-in artefacts carry for the tools after the converter (the real ones carry a graph)."""
    def tensor(name, dims, dtype, perm, src):
        code = float_type if ONNX_TYPES.get(dtype) in (FLOAT_32, FLOAT_16) else ONNX_TYPES.get(dtype, FLOAT_32)
        return {"name": _qnn_name(name), "onnx_name": name, "onnx_dtype": dtype, "data_type": code, "quant": None,
                "dims": [dims[i] for i in perm] if perm else dims, "perm": list(perm) if perm else None,
                "src_axis_format": src, "axis_format": CHANNEL_LAST_NAME.get(src, src) if perm else src}

    def source_layout(name, dims):
        return perms.get(name, (None, DEFAULT_LAYOUT.get(len(dims), "NONTRIVIAL")))

    ins = [tensor(i.name, _dims(i), _onnx_dtype(i), *source_layout(i.name, _dims(i))) for i in inputs]
    outs = [tensor(o.name, _dims(o), _onnx_dtype(o), *source_layout(o.name, _dims(o))) for o in model.graph.output]
    return {"graph": graph, "source": str(onnx_path.resolve()), "inputs": ins, "outputs": outs, "nodes": _nodes(model),
            "act_bitwidth": None, "per_row": False}


def _meta_line(meta: dict) -> str:
    return f"// meta: {json.dumps(meta)}\n"


def _meta_from_text(text: str, what: str) -> dict:
    match = re.search(r"^// meta: (.+)$", text, re.M)
    if not match:
        raise Fail(f"ERROR - {what} is not a model this SDK made")
    return json.loads(match.group(1))


# --------------------------------------------------------------------------------------------------------------
# --quantization_overrides: AIMET's encodings formats, as the converters read them

OVERRIDE_KEYS = ("version", "activation_encodings", "param_encodings", "quantizer_args", "producer", "excluded_layers")
ENC_TYPES = ("PER_TENSOR", "PER_CHANNEL", "PER_BLOCK", "LPBQ", "VECTOR")


def _read_overrides(path: str, model) -> dict:
    """The overrides file checked against the model: the legacy form ({tensor: [{"bitwidth", ...}]}, no version or
    "0.6.1") or AIMET's 1.0.0 list form; every tensor named must be in the graph (an activation: a node output or
    graph input or a constant; a param: an initializer), and a 1.0.0 entry needs its fields with one scale/offset per channel.
    Returns {"activations": {onnx name: entry}, "params": {...}} normalised to {bw, scale[], offset[]}."""
    data = _read_json(path, "quantization overrides")
    unknown = [k for k in data if k not in OVERRIDE_KEYS]
    if unknown:
        raise Fail(f"ERROR - quantization overrides {path}: unknown keys {unknown}")
    version = data.get("version", "0.6.1")
    if version not in ("0.6.1", "1.0.0"):
        raise Fail(f"ERROR - quantization overrides {path}: encodings version {version!r} is not supported "
                   "(0.6.1 or 1.0.0)")
    initializers = {i.name: list(i.dims) for i in model.graph.initializer}
    # activation encodings name any tensor of the graph (AIMET lists constant inputs it quantizes, such as a PRelu
    # slope, there too); param encodings name weights
    activations = {n for node in model.graph.node for n in node.output} | {i.name for i in model.graph.input} | \
        set(initializers)
    axes = _weight_axes(model)
    found = {}
    for kind, known in (("activation_encodings", activations), ("param_encodings", initializers)):
        section = data.get(kind, [] if version == "1.0.0" else {})
        if version == "1.0.0":
            if not isinstance(section, list):
                raise Fail(f"ERROR - quantization overrides {path}: {kind} must be a list in version 1.0.0")
            entries = [(e.get("name") if isinstance(e, dict) else None, e) for e in section]
        else:
            if not isinstance(section, dict):
                raise Fail(f"ERROR - quantization overrides {path}: {kind} must be an object in version 0.6.1")
            entries = list(section.items())
        result = {}
        for name, entry in entries:
            if name not in known:
                raise Fail(f"ERROR - quantization overrides {path}: {kind} names {name!r}, which is not a "
                           f"{'tensor' if kind == 'activation_encodings' else 'parameter'} of the model")
            result[name] = _override_entry(path, name, entry, version, initializers.get(name), axes.get(name))
        found["activations" if kind == "activation_encodings" else "params"] = result
    return found


def _weight_axes(model) -> dict:
    """weight name -> (output channels, input channels) from the op that reads it: where per-channel scales and
    blocks run (Conv [O, I, kh, kw]; ConvTranspose [I, O, ...]; Gemm [K, N] or [N, K] with transB; MatMul [K, N])."""
    dims = {i.name: list(i.dims) for i in model.graph.initializer}
    axes = {}
    for node in model.graph.node:
        if len(node.input) < 2 or node.input[1] not in dims or len(dims[node.input[1]]) < 2:
            continue
        d = dims[node.input[1]]
        trans_b = any(a.name == "transB" and a.i for a in node.attribute)
        if node.op_type == "Conv":
            axes[node.input[1]] = (d[0], d[1])
        elif node.op_type == "ConvTranspose":
            axes[node.input[1]] = (d[1], d[0])
        elif node.op_type == "Gemm":
            axes[node.input[1]] = (d[0], d[1]) if trans_b else (d[1], d[0])
        elif node.op_type == "MatMul":
            axes[node.input[1]] = (d[-1], d[-2])
    return axes


def _block_checks(where: str, entry: dict, axes) -> None:
    """A PER_BLOCK or LPBQ param encoding (AIMET's 1.0.0 form, as the QAIRT converters take it): blocks along the
    input channels; LPBQ has one float scale and offset per output channel, per-block integer scales of
    bw - compressed_bw bits (int4 decompressed to 8 bit: 4-bit scales in [1, 16]) and the symmetric offset."""
    block = entry.get("block_size")
    if not isinstance(block, int) or isinstance(block, bool) or block <= 0:
        raise Fail(f"{where}: {entry['enc_type']} needs a positive integer 'block_size', got {block!r}")
    if axes is None:
        raise Fail(f"{where}: {entry['enc_type']} on a tensor that is no Conv/Gemm/MatMul weight")
    out_channels, in_channels = axes
    if in_channels % block:
        raise Fail(f"{where}: block_size {block} does not divide the {in_channels} input channels")
    blocks = out_channels * (in_channels // block)
    if entry["enc_type"] == "PER_BLOCK":
        if len(entry["scale"]) != blocks:
            raise Fail(f"{where}: PER_BLOCK with {len(entry['scale'])} scales, the tensor has {blocks} blocks")
        return
    compressed, bw = entry.get("compressed_bw"), entry["bw"]
    if not isinstance(compressed, int) or not 0 < compressed < bw:
        raise Fail(f"{where}: LPBQ needs an integer 'compressed_bw' below bw {bw}, got {compressed!r}")
    if not entry["is_sym"]:
        raise Fail(f"{where}: LPBQ is symmetric ('is_sym': true)")
    if len(entry["scale"]) != out_channels:
        raise Fail(f"{where}: LPBQ with {len(entry['scale'])} per-channel scales, the tensor has {out_channels} "
                   "output channels")
    if any(o != -(2 ** (bw - 1)) for o in entry["offset"]):
        raise Fail(f"{where}: LPBQ offsets must all be {-(2 ** (bw - 1))} (symmetric {bw}-bit)")
    ints = entry.get("per_block_int_scale")
    top = 2 ** (bw - compressed)
    if not isinstance(ints, list) or len(ints) != blocks:
        raise Fail(f"{where}: LPBQ needs 'per_block_int_scale' with one integer per block ({blocks}), got "
                   f"{len(ints) if isinstance(ints, list) else ints!r}")
    if any(not isinstance(i, int) or not 1 <= i <= top for i in ints):
        raise Fail(f"{where}: per_block_int_scale values must be integers in [1, {top}]")


def _override_entry(path: str, name: str, entry, version: str, dims, axes=None) -> dict:
    where = f"ERROR - quantization overrides {path}: {name}"
    if version == "1.0.0":
        required = {"name": str, "bw": int, "dtype": str, "enc_type": str, "is_sym": bool}
        for key, kind in required.items():
            if not isinstance(entry.get(key), kind):
                raise Fail(f"{where}: {key!r} missing or not {kind.__name__}")
        if entry["dtype"] not in ("INT", "FLOAT") or entry["enc_type"] not in ENC_TYPES:
            raise Fail(f"{where}: dtype {entry['dtype']!r} / enc_type {entry['enc_type']!r} not known")
        bw = entry["bw"]
        scale, offset = entry.get("scale"), entry.get("offset")
        if entry["dtype"] == "INT":
            if not (isinstance(scale, list) and isinstance(offset, list) and len(scale) == len(offset) and scale):
                raise Fail(f"{where}: an INT encoding needs equal-length scale and offset lists")
            channels = 1 if entry["enc_type"] == "PER_TENSOR" else (axes[0] if axes else dims[0] if dims else None)
            if entry["enc_type"] in ("PER_TENSOR", "PER_CHANNEL") and channels is not None and len(scale) != channels:
                raise Fail(f"{where}: {entry['enc_type']} with {len(scale)} scales, the tensor has {channels} "
                           "channel(s)")
            if entry["enc_type"] in ("PER_BLOCK", "LPBQ"):
                _block_checks(where, entry, axes)
    else:
        if not (isinstance(entry, list) and entry and all(isinstance(e, dict) for e in entry)):
            raise Fail(f"{where}: expected a list of encodings")
        bw = entry[0].get("bitwidth")
        scale = [e["scale"] for e in entry if "scale" in e] or None
        offset = [e["offset"] for e in entry if "offset" in e] or None
    if bw not in (4, 8, 16, 32):
        raise Fail(f"{where}: bitwidth {bw!r} (4, 8, 16 or 32)")
    blocks = {"block_size": entry["block_size"], "enc_type": entry["enc_type"]} \
        if version == "1.0.0" and entry.get("enc_type") in ("PER_BLOCK", "LPBQ") else {}
    return {"bw": bw, "scale": scale, "offset": offset, **blocks}


def _lpbq_note(meta: dict) -> str:
    found = meta.get("overridden", {})
    return (f" ({found['lpbq']} LPBQ, block_size {', '.join(map(str, found['block_sizes']))})"
            if found.get("lpbq") else "")


def _apply_overrides(meta: dict, overrides: dict | None) -> int:
    """Overridden encodings of graph I/O tensors replace the calibrated ones (as the real quantizer's do); the
    number of overridden activations and params is recorded."""
    if not overrides:
        return 0
    for t in meta["inputs"] + meta["outputs"]:
        entry = overrides["activations"].get(t["onnx_name"])
        if entry and entry["scale"] and t["quant"] is not None:
            t["data_type"] = UFIXED_16 if entry["bw"] == 16 else UFIXED_8
            t["quant"] = {"scale": float(entry["scale"][0]), "offset": int(entry["offset"][0])}
    meta["overridden"] = {"activations": len(overrides["activations"]), "params": len(overrides["params"])}
    blocked = [e for e in overrides["params"].values() if e.get("enc_type") == "LPBQ"]
    if blocked:  # the real converter's log says nothing of it: the tests read it from the stand-in's output
        meta["overridden"]["lpbq"] = len(blocked)
        meta["overridden"]["block_sizes"] = sorted({e["block_size"] for e in blocked})
    return len(overrides["activations"]) + len(overrides["params"])


# --------------------------------------------------------------------------------------------------------------
# model-lib flow

def main_converter(argv: list[str], sdk: Path) -> int:
    p = _parser("qnn-onnx-converter")
    p.add_argument("--input_network", "-i", required=True)
    p.add_argument("--output_path", "-o")
    p.add_argument("--out_node", "--out_name", action="append")
    p.add_argument("--input_dim", "-d", nargs=2, action="append")
    p.add_argument("--input_dtype", nargs=2, action="append", default=[])
    p.add_argument("--input_layout", nargs=2, action="append", default=[])
    p.add_argument("--quantization_overrides")
    p.add_argument("--preserve_io", nargs="*")
    _add_quantizer_flags(p)
    args = p.parse_args(argv)

    model, graph_inputs = _load_onnx(args.input_network)
    onnx_path = Path(args.input_network)
    names = [i.name for i in graph_inputs]
    for name, dtype in args.input_dtype:
        if name not in names:
            raise Fail(f"ERROR - --input_dtype: {name} is not an input of the model (inputs: {names})")
        if dtype not in DTYPES:
            raise Fail(f"ERROR - --input_dtype {name}: unsupported dtype {dtype}")
    declared = {}
    for name, layout in args.input_layout:
        if name not in names or layout not in LAYOUTS:
            raise Fail(f"ERROR - --input_layout {name} {layout}: unknown input or layout")
        declared[name] = layout
    _log("INFO", 228, f"Processing ONNX model {onnx_path} ({len(model.graph.node)} nodes)")
    if _unsupported(model):
        return 1
    _warnings(model)

    overrides = _read_overrides(args.quantization_overrides, model) if args.quantization_overrides else None
    keep = bool(os.environ.get("FAKE_QAIRT_KEEP_LAYOUT"))
    perms = {}
    for value in list(graph_inputs) + list(model.graph.output):
        dims = _dims(value)
        layout = declared.get(value.name) or DEFAULT_LAYOUT.get(len(dims), "NONTRIVIAL")
        perms[value.name] = (None if keep else CHANNEL_LAST.get(layout), layout)
    output = Path(args.output_path or onnx_path.with_suffix(".cpp"))
    stem = output.with_suffix("")
    meta = _graph_meta(model, onnx_path, _qnn_name(stem.name), graph_inputs, perms,
                       FLOAT_16 if args.float_bitwidth == 16 else FLOAT_32)
    if args.input_list:
        _check_quantizer_flags(args)
        specs = [{"name": t["name"], "onnx_name": t["onnx_name"], "dims": t["dims"], "dtype": t["onnx_dtype"]}
                 for t in meta["inputs"]]
        samples = _read_input_list(args.input_list, specs, args.use_native_input_files)
        act_bits = args.act_bitwidth or 8
        _log("INFO", 301, f"Quantizing with {len(samples)} calibration samples: act {act_bits} bit, weights "
                          f"{args.weights_bitwidth or 8} bit, bias {args.bias_bitwidth or 8} bit")
        _quantize_io(meta, samples, act_bits)
        if _apply_overrides(meta, overrides):
            _log("INFO", 305, f"Applied quantization overrides from {args.quantization_overrides}: "
                              f"{meta['overridden']['activations']} activation(s), {meta['overridden']['params']} param(s)"
                              + _lpbq_note(meta))
        meta.update(act_bitwidth=act_bits, per_row=args.use_per_row_quantization)
    elif args.float_bitwidth == 16:
        _log("INFO", 302, "Converting float tensors to fp16")

    output.parent.mkdir(parents=True, exist_ok=True)
    command = "qnn-onnx-converter " + " ".join(argv)
    output.write_text(f"// stand-in qnn-onnx-converter output\n// graph: {meta['graph']}\n// command: {command}\n"
                      + _meta_line(meta))
    weights = hashlib.sha256(onnx_path.read_bytes() + command.encode()).hexdigest()
    Path(f"{stem}.bin").write_text(f"stand-in weights {weights}\n")
    tensors = {}
    for kind, group in ((0, meta["inputs"]), (1, meta["outputs"])):
        for t in group:
            q = t["quant"]
            tensors[t["name"]] = {
                "id": len(tensors) + 1, "type": kind, "dataFormat": 0, "data_type": t["data_type"],
                "src_axis_format": t["src_axis_format"], "axis_format": t["axis_format"], "dims": t["dims"],
                "quant_params": {"definition": 1 if q else UNDEFINED, "encoding": 0 if q else UNDEFINED,
                                 "scale_offset": q or {"scale": 0.0, "offset": 0}}}
    nodes = {n["name"]: {"package": "qti.aisw", "type": n["type"]} for n in meta["nodes"]}
    Path(f"{stem}_net.json").write_text(json.dumps({
        "model.cpp": str(output), "model.bin": f"{stem}.bin", "converter_command": command, "copyright_str": "",
        "graph": {"tensors": tensors, "nodes": nodes}}, indent=1))
    _log("INFO", 410, f"Model CPP saved at: {output}")
    return 0


def main_model_lib_generator(argv: list[str], sdk: Path) -> int:
    p = _parser("qnn-model-lib-generator")
    p.add_argument("-c", required=True, metavar="<QNN_MODEL>.cpp")
    p.add_argument("-b", metavar="<QNN_MODEL>.bin")
    p.add_argument("-t", nargs="+", choices=TARGETS, metavar="LIB_TARGETS")
    p.add_argument("-l", metavar="LIB_NAME")
    p.add_argument("-o", default="lib", metavar="OUTPUT_DIR")
    args = p.parse_args(argv)
    cpp = _existing(args.c, "model cpp")
    if args.b:
        _existing(args.b, "model bin")
    targets = args.t or list(TARGETS)
    if "x86_64-linux-clang" in targets:
        for program, accepted in (("clang++", ("clang++", "clang++-9")), ("make", ("make",))):
            if not any(shutil.which(a) for a in accepted):
                raise Fail(f"ERROR: {program} not found: the x86_64-linux-clang model library is built with clang++ "
                           "and make")
    if "aarch64-android" in targets and not shutil.which("ndk-build"):
        raise Fail("ERROR: ndk-build not found: put the Android NDK on PATH to build aarch64-android "
                   "(or pass -t x86_64-linux-clang)")
    name = args.l or Path(args.b or args.c).stem
    text = cpp.read_text()
    for target in targets:
        lib = Path(args.o) / target / f"lib{name}.so"
        lib.parent.mkdir(parents=True, exist_ok=True)
        lib.write_text(f"stand-in model lib target={target}\n{text}")
        print(f"Built {lib}")
    return 0


def _read_json(path: str, what: str) -> dict:
    try:
        return json.loads(_existing(path, what).read_text())
    except ValueError as e:
        raise Fail(f"ERROR - {what} {path} is not valid JSON: {e}") from None


def _validate_ops(meta: dict, arch: int) -> tuple[dict, str] | None:
    """The first node HTP would refuse, with the backend's reason."""
    reject = os.environ.get("FAKE_QAIRT_REJECT_OP")
    for node in meta["nodes"]:
        if node["onnx_type"] == reject:
            return node, "None of the combinations match the provided case"
    if meta.get("act_bitwidth") == 16 and arch < 73 and not meta.get("per_row"):
        for node in meta["nodes"]:
            if node["type"] in ("MatMul", "FullyConnected"):
                return node, f"[4294967295] has incorrect Value {arch}, expected >= 73."
    return None


def main_context_binary_generator(argv: list[str], sdk: Path) -> int:
    p = _parser("qnn-context-binary-generator")
    p.add_argument("--backend", required=True)
    p.add_argument("--model", required=True)
    if _sdk_version(sdk) >= (2, 21):
        p.add_argument("--dlc_path")
    p.add_argument("--binary_file", required=True)
    p.add_argument("--model_prefix")
    p.add_argument("--output_dir", default="./output")
    p.add_argument("--config_file")
    p.add_argument("--log_level", choices=("error", "warn", "info", "verbose", "debug"))
    args = p.parse_args(argv)
    backend = _existing(args.backend, "backend")
    if backend.name != "libQnnHtp.so":
        raise Fail(f"ERROR - stand-in: only the HTP backend is known, got {backend}")
    model = _existing(args.model, "model library")
    dlc = getattr(args, "dlc_path", None)
    if dlc:
        if model.name != "libQnnModelDlc.so":
            raise Fail(f"ERROR - --dlc_path needs --model libQnnModelDlc.so, got {model}")
        metas = [_read_dlc(path) for path in dlc.split(",")]  # several DLCs: one context holding every graph
        graphs = [m["graph"] for m in metas]
        if len(set(graphs)) != len(graphs):
            raise Fail(f"ERROR - --dlc_path {dlc}: two DLCs hold a graph of the same name ({graphs})")
    else:
        metas = [_meta_from_text(model.read_text(), f"model library {model}")]  # --model takes one library
    meta = metas[0]
    sharing = False
    soc = {"soc_type": "UNKNOWN", "arch": "68", "vtcm_size": 0, "soc_id": 0}
    if args.config_file:
        extensions = _read_json(args.config_file, "config file")["backend_extensions"]
        _existing(extensions["shared_library_path"], "backend extensions library")
        config = _read_json(extensions["config_file_path"], "backend config")
        graph_config, device = config["graphs"][0], config["devices"][0]
        context = config.get("context", {})
        if not isinstance(context, dict) or set(context) - {"weight_sharing_enabled"}:
            raise Fail(f"ERROR - unknown context config {context!r} (known: weight_sharing_enabled)")
        sharing = context.get("weight_sharing_enabled", False)
        if not isinstance(sharing, bool):
            raise Fail(f"ERROR - context.weight_sharing_enabled must be true or false, got {sharing!r}")
        for m in metas:
            if m["graph"] not in graph_config["graph_names"]:
                raise Fail(f"ERROR - graph {m['graph']} is not in graph_names {graph_config['graph_names']}")
        if not isinstance(device["soc_id"], int) or not re.fullmatch(r"v\d\d", device["dsp_arch"]):
            raise Fail(f"ERROR - bad device config {device}")
        soc = {"soc_type": SOC_NAMES.get(device["soc_id"], f"UNKNOWN({device['soc_id']})"), "soc_id": device["soc_id"],
               "arch": device["dsp_arch"][1:], "vtcm_size": graph_config["vtcm_mb"] * 1024 * 1024}
    print(f"qnn-context-binary-generator pid:{os.getpid()}\n <W> Initializing HtpProvider", flush=True)
    if sharing and len(metas) == 1:  # what users report for weight sharing on a one-graph context (not fatal)
        print("   98.1ms [ ERROR ] wtshare_operation.cc:1057::ERROR:small.is_shared()", flush=True)
    refused = next(filter(None, (_validate_ops(m, int(soc["arch"])) for m in metas)), None)
    if refused:
        node, reason = refused
        print(f"   121.6ms [ ERROR ]  <E> {reason}\n   121.6ms [ ERROR ]  <E> QnnBackend_validateOpConfig failed 3110\n"
              f"   121.6ms [ ERROR ]  <E> Failed to validate op {node['name']} with error 0xc26")
        if dlc:
            print("    82.5ms [ ERROR ] Failed to successfully compose graph\n"
                  "   121.6ms [ ERROR ] Failed in QnnSystemDlc_composeGraphs() with error code 1002")
        else:
            print(f"[ ERROR ] QnnModel::addNode() validating node {node['name']} failed.\n"
                  f"[ ERROR ] {meta['graph']}.addNode(QNN_OPCONFIG_VERSION_1, \"{node['name']}\", \"qti.aisw\", "
                  f"\"{node['type']}\", params_{node['name']}, 0, inputs_{node['name']}, 1, outputs_{node['name']}, 1) "
                  "expected MODEL_NO_ERROR, got MODEL_GRAPH_OP_VALIDATION_ERROR\n"
                  "   132.5ms [ ERROR ] Failed in composeGraphs()")
        print("   121.6ms [ ERROR ] ComposeGraphs Failed with error = 1\nGraph Compose failure")
        return 1
    out = Path(args.output_dir) / f"{args.binary_file}.bin"
    out.parent.mkdir(parents=True, exist_ok=True)
    config_string = f"soc_type={soc['soc_type']};arch={soc['arch']};vtcm_size={soc['vtcm_size']};"
    stamp = {"soc_id": soc["soc_id"], "dsp_arch": int(soc["arch"]), "sdk_version": ".".join(map(str, _sdk_version(sdk)))}
    meta = dict(meta, **stamp) if len(metas) == 1 else {"graphs": metas, "weight_sharing": sharing, **stamp}
    out.write_bytes(STAND_IN_BINARY + config_string.encode() + b"\0\n" + _meta_line(meta).encode())
    print(f"Saved context binary {out}")
    return 0


def _binary_meta(path: str) -> dict:
    data = _existing(path, "context binary").read_bytes()
    if not data.startswith(STAND_IN_BINARY):
        raise Fail(f"Error: Failed to get context binary info. ({path} is not a context binary)")
    return _meta_from_text(data.decode(errors="replace"), f"context binary {path}")


def main_context_binary_utility(argv: list[str], sdk: Path) -> int:
    """Writes a binary's graphs and their I/O tensors as JSON, in the layout of real dumps."""
    p = _parser("qnn-context-binary-utility")
    p.add_argument("--context_binary", required=True)
    p.add_argument("--json_file", required=True)
    args = p.parse_args(argv)
    meta = _binary_meta(args.context_binary)

    def tensor(t, i, kind):
        q = t["quant"]
        return {"info": {
            "id": i, "name": t["name"], "type": kind, "dataFormat": "QNN_TENSOR_DATA_FORMAT_FLAT_BUFFER",
            "dataType": f"QNN_DATATYPE_{TYPE_NAMES[t['data_type']]}", "rank": len(t["dims"]), "dimensions": t["dims"],
            "quantizeParams": {"definition": "QNN_DEFINITION_DEFINED" if q else "QNN_DEFINITION_UNDEFINED",
                               "quantizationEncoding": "QNN_QUANTIZATION_ENCODING_SCALE_OFFSET" if q else
                               "QNN_QUANTIZATION_ENCODING_UNDEFINED", "scaleOffset": q or {"scale": 0.0, "offset": 0}}}}

    ids = iter(range(1, 10 ** 6))
    info = {"info": {"backendId": 6, "buildId": f"v{meta['sdk_version']}.stand-in",
                     "contextMetadata": {"socModel": meta["soc_id"], "dspArch": meta["dsp_arch"]},
                     "graphs": [{"info": {
                         "graphName": g["graph"],
                         "graphInputs": [tensor(t, next(ids), "QNN_TENSOR_TYPE_APP_WRITE") for t in g["inputs"]],
                         "graphOutputs": [tensor(t, next(ids), "QNN_TENSOR_TYPE_APP_READ") for t in g["outputs"]]}}
                         for g in meta.get("graphs", [meta])]},
            "version": "v1"}
    Path(args.json_file).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json_file).write_text(json.dumps(info, indent=2))
    return 0


def main_net_run(argv: list[str], sdk: Path) -> int:
    """Runs the float ONNX model the binary was made from, with QNN-layout float32 raw files in and out."""
    p = _parser("qnn-net-run")
    p.add_argument("--backend", required=True)
    p.add_argument("--model")
    p.add_argument("--retrieve_context")
    p.add_argument("--input_list", required=True)
    p.add_argument("--output_dir", default="./output")
    p.add_argument("--use_native_input_files", action="store_true")
    p.add_argument("--use_native_output_files", action="store_true")
    p.add_argument("--log_level", choices=("error", "warn", "info", "verbose", "debug"))
    args = p.parse_args(argv)
    _existing(args.backend, "backend")
    if not args.retrieve_context:
        raise Fail("ERROR - stand-in: only --retrieve_context <context binary> is known")
    import numpy as np
    meta = _binary_meta(args.retrieve_context)
    specs = [{"name": t["name"], "onnx_name": t["onnx_name"], "dims": t["dims"], "dtype": "float32"}
             for t in meta["inputs"]]
    samples = _read_input_list(args.input_list, specs, native=False)
    for index, outputs in enumerate(_run_onnx(meta["source"], [_onnx_feed(meta, s) for s in samples])):
        for t in meta["outputs"]:
            value = np.asarray(outputs[t["onnx_name"]])
            out = Path(args.output_dir) / f"Result_{index}" / f"{t['name']}.raw"
            out.parent.mkdir(parents=True, exist_ok=True)
            np.ascontiguousarray(value.transpose(t["perm"]) if t.get("perm") else value).astype(np.float32).tofile(out)
    return 0


# --------------------------------------------------------------------------------------------------------------
# DLC flow

def _read_dlc(path: str) -> dict:
    data = _existing(path, "DLC").read_bytes()
    if not data.startswith(STAND_IN_DLC):
        raise Fail(f"ERROR - {path} is not a DLC")
    return json.loads(data[len(STAND_IN_DLC):])


def _write_dlc(path: Path, meta: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(STAND_IN_DLC + json.dumps(meta).encode())


def main_qairt_converter(argv: list[str], sdk: Path) -> int:
    p = _parser("qairt-converter")
    p.add_argument("--input_network", "-i", required=True)
    p.add_argument("--output_path", "-o")
    p.add_argument("--source_model_input_shape", "-s", nargs=2, action="append")
    p.add_argument("--out_tensor_node", "--out_tensor_name", action="append")
    p.add_argument("--source_model_input_datatype", nargs=2, action="append", default=[])
    p.add_argument("--source_model_input_layout", nargs=2, action="append", default=[])
    p.add_argument("--desired_input_layout", nargs=2, action="append", default=[])
    p.add_argument("--source_model_output_layout", nargs=2, action="append", default=[])
    p.add_argument("--desired_output_layout", nargs=2, action="append", default=[])
    p.add_argument("--preserve_io_datatype", nargs="*")
    p.add_argument("--quantization_overrides", "-q")
    p.add_argument("--float_bitwidth", type=int, choices=(16, 32))
    p.add_argument("--float_bias_bitwidth", type=int, choices=(16, 32))
    p.add_argument("--onnx_skip_simplification", "-oss", action="store_true")
    p.add_argument("--export_format", choices=("DLC_DEFAULT", "DLC_STRIP_QUANT"))
    p.add_argument("--target_backend", choices=("CPU", "GPU", "DSP", "HTP", "HTA", "LPAI"))
    p.add_argument("--target_soc_model")
    p.add_argument("--debug", nargs="?", const=True)
    args = p.parse_args(argv)
    model, graph_inputs = _load_onnx(args.input_network)
    onnx_path = Path(args.input_network)
    names = [i.name for i in graph_inputs]
    for name, dtype in args.source_model_input_datatype:
        if name not in names:
            raise Fail(f"ERROR - --source_model_input_datatype: {name} is not an input of the model (inputs: {names})")
        if dtype not in DTYPES:
            raise Fail(f"ERROR - --source_model_input_datatype {name}: unsupported datatype {dtype}")
    for flag in ("source_model_input_layout", "desired_input_layout"):
        for name, layout in getattr(args, flag):
            if name not in names or layout not in LAYOUTS:
                raise Fail(f"ERROR - --{flag} {name} {layout}: unknown input or layout")
    if args.target_soc_model and not args.target_backend:
        raise Fail("ERROR - --target_backend option must be provided to use --target_soc_model option")
    _log("INFO", 228, f"Processing ONNX model {onnx_path} ({len(model.graph.node)} nodes)")
    if _unsupported(model):
        return 1
    _warnings(model)
    output = Path(args.output_path or onnx_path.with_suffix(".dlc"))
    # The source layout of every input and output is kept (no permutation: unlike qnn-onnx-converter).
    perms = {v.name: (None, DEFAULT_LAYOUT.get(len(_dims(v)), "NONTRIVIAL"))
             for v in list(graph_inputs) + list(model.graph.output)}
    meta = _graph_meta(model, onnx_path, _qnn_name(output.stem), graph_inputs, perms,
                       FLOAT_16 if args.float_bitwidth == 16 else FLOAT_32)
    for t in meta["inputs"] + meta["outputs"] + meta["nodes"]:
        t["name"] = t["onnx_name"] or t["name"]  # a DLC keeps the source names of tensors and nodes
    if args.quantization_overrides:
        meta["overrides"] = _read_overrides(args.quantization_overrides, model)
    meta["command"] = "qairt-converter " + " ".join(argv)
    _write_dlc(output, meta)
    _log("INFO", 410, f"DLC saved at: {output}")
    return 0


def main_qairt_quantizer(argv: list[str], sdk: Path) -> int:
    p = _parser("qairt-quantizer")
    p.add_argument("--input_dlc", "-i", required=True)
    p.add_argument("--output_dlc", "-o")
    p.add_argument("--enable_float_fallback", "-f", action="store_true")
    p.add_argument("--apply_algorithms", nargs="+", choices=("cle",))
    p.add_argument("--ignore_quantization_overrides", action="store_true")
    p.add_argument("--preserve_io_datatype", nargs="*")
    p.add_argument("--keep_weights_quantized", action="store_true")
    p.add_argument("--adjust_bias_encoding", action="store_true")
    p.add_argument("--use_aimet_quantizer", action="store_true")
    p.add_argument("--dump_encoding_json", action="store_true")
    p.add_argument("--config", "-c")
    p.add_argument("--export_stripped_dlc", action="store_true")
    p.add_argument("--target_backend", choices=("CPU", "GPU", "DSP", "HTP", "HTA", "LPAI"))
    p.add_argument("--target_soc_model")
    p.add_argument("--debug", nargs="?", const=True)
    _add_quantizer_flags(p)
    args = p.parse_args(argv)
    meta = _read_dlc(args.input_dlc)
    if not args.input_list:
        raise Fail("ERROR - --input_list must be specified for quantization")
    if args.enable_float_fallback:
        raise Fail("ERROR - --enable_float_fallback: input list must not be provided")
    _check_quantizer_flags(args)
    specs = [{"name": t["name"], "onnx_name": t["onnx_name"], "dims": t["dims"], "dtype": t["onnx_dtype"]}
             for t in meta["inputs"]]
    samples = _read_input_list(args.input_list, specs, args.use_native_input_files)
    act_bits = args.act_bitwidth or 8
    _log("INFO", 301, f"Quantizing with {len(samples)} calibration samples: act {act_bits} bit, weights "
                      f"{args.weights_bitwidth or 8} bit, bias {args.bias_bitwidth or 8} bit")
    _quantize_io(meta, samples, act_bits)
    if not args.ignore_quantization_overrides and _apply_overrides(meta, meta.get("overrides")):
        _log("INFO", 305, f"Applied quantization overrides carried by {args.input_dlc}: "
                          f"{meta['overridden']['activations']} activation(s), {meta['overridden']['params']} param(s)"
                              + _lpbq_note(meta))
    meta.update(act_bitwidth=act_bits, per_row=args.use_per_row_quantization,
                quantizer_command="qairt-quantizer " + " ".join(argv))
    output = Path(args.output_dlc or str(Path(args.input_dlc).with_suffix("")) + "_quantized.dlc")
    _write_dlc(output, meta)
    _log("INFO", 420, f"Quantized DLC saved at: {output}")
    return 0


MAINS = {"qnn-onnx-converter": main_converter, "qnn-model-lib-generator": main_model_lib_generator,
         "qnn-context-binary-generator": main_context_binary_generator,
         "qnn-context-binary-utility": main_context_binary_utility, "qnn-net-run": main_net_run,
         "qairt-converter": main_qairt_converter, "qairt-quantizer": main_qairt_quantizer}


def main(tool: str, argv: list[str], script: str) -> int:
    _record(tool, argv)
    sdk = Path(script).absolute().parent.parent.parent
    try:
        _check_env(tool, sdk)
        return MAINS[tool](argv, sdk)
    except Fail as e:
        print(e, file=sys.stderr)
        return 1

"""The stand-in QAIRT command-line tools (see make_sdk.py). Each main_* parses its arguments with the real tool's
flag names and arity (a subset: the ones a build could pass), fails like the real tool on a missing input, and
writes outputs a test can recognise. Every call is appended to $FAKE_QAIRT_LOG as one JSON line:
{"tool": ..., "argv": [...], "cwd": ..., "LDFLAGS": ...}.

Test switches (environment):
  FAKE_QAIRT_UNSUPPORTED_OP=<OpType>  the converter rejects a model holding that op, as the real one would
  FAKE_QAIRT_WARNING=1                the converter prints a quantization warning
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
from pathlib import Path

SOC_NAMES = {35: "SM8350", 36: "SM8450", 39: "SA8295", 42: "SM8475", 43: "SM8550", 52: "SA8255", 57: "SM8650",
             69: "SM8750", 77: "QCS9100", 87: "SM8850"}
LAYOUTS = ("NCDHW", "NDHWC", "NCHW", "NHWC", "NFC", "NCF", "NTF", "TNF", "NF", "NC", "F", "NONTRIVIAL")
CHANNEL_LAST = {"NCF": (0, 2, 1), "NCHW": (0, 2, 3, 1), "NCDHW": (0, 2, 3, 4, 1)}
DEFAULT_LAYOUT = {3: "NCF", 4: "NCHW", 5: "NCDHW"}
TARGETS = ("x86_64-linux-clang", "aarch64-android")


class Fail(Exception):
    pass


def _parser(prog: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=prog, allow_abbrev=False)


def _record(tool: str, argv: list[str]) -> None:
    log = os.environ.get("FAKE_QAIRT_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"tool": tool, "argv": argv, "cwd": os.getcwd(),
                                "LDFLAGS": os.environ.get("LDFLAGS")}) + "\n")


def _existing(path: str, what: str) -> Path:
    if not Path(path).is_file():
        raise Fail(f"ERROR - {what} {path} does not exist")
    return Path(path)


def _qnn_name(name: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return f"_{name}" if name[:1].isdigit() else name


# --------------------------------------------------------------------------------------------------------------

def main_converter(argv: list[str]) -> int:
    p = _parser("qnn-onnx-converter")
    p.add_argument("--input_network", "-i", required=True)
    p.add_argument("--output_path", "-o")
    p.add_argument("--out_node", "--out_name", action="append")
    p.add_argument("--input_dim", "-d", nargs=2, action="append")
    p.add_argument("--input_dtype", nargs=2, action="append", default=[])
    p.add_argument("--input_layout", nargs=2, action="append", default=[])
    p.add_argument("--input_list")
    p.add_argument("--use_native_input_files", action="store_true")
    p.add_argument("--act_bitwidth", type=int, choices=(8, 16))
    p.add_argument("--weights_bitwidth", type=int, choices=(4, 8, 16))
    p.add_argument("--bias_bitwidth", type=int, choices=(8, 32))
    p.add_argument("--float_bitwidth", type=int, choices=(16, 32))
    p.add_argument("--param_quantizer_schema", choices=("asymmetric", "symmetric", "unsignedsymmetric"))
    p.add_argument("--act_quantizer_calibration", choices=("min-max", "sqnr", "entropy", "mse", "percentile"))
    p.add_argument("--param_quantizer_calibration", choices=("min-max", "sqnr", "entropy", "mse", "percentile"))
    p.add_argument("--use_per_channel_quantization", action="store_true")
    p.add_argument("--quantization_overrides")
    p.add_argument("--preserve_io", nargs="*")
    args = p.parse_args(argv)

    import onnx
    onnx_path = _existing(args.input_network, "input network")
    model = onnx.load(str(onnx_path))
    initializers = {i.name for i in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in initializers]
    names = [i.name for i in graph_inputs]
    for name, dtype in args.input_dtype:
        if name not in names:
            raise Fail(f"ERROR - --input_dtype: {name} is not an input of the model (inputs: {names})")
        if dtype not in ("float32", "float16", "int32", "uint8", "int8", "bool"):
            raise Fail(f"ERROR - --input_dtype {name}: unsupported dtype {dtype}")
    layouts = {}
    for name, layout in args.input_layout:
        if name not in names or layout not in LAYOUTS:
            raise Fail(f"ERROR - --input_layout {name} {layout}: unknown input or layout")
        layouts[name] = layout
    ops = sorted({n.op_type for n in model.graph.node})
    unsupported = os.environ.get("FAKE_QAIRT_UNSUPPORTED_OP")
    print(f"INFO - Processing ONNX model {onnx_path} ({len(model.graph.node)} nodes)")
    if unsupported and unsupported in ops:
        node = next(n for n in model.graph.node if n.op_type == unsupported)
        print(f"ERROR - Node {node.name}: No translation registered for op type onnx_{unsupported.lower()}")
        print("ERROR - Conversion FAILED!")
        return 1

    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph_inputs}
    if args.input_list:
        lines = [line.split() for line in _existing(args.input_list, "input list").read_text().splitlines()
                 if line.strip()]
        if not lines:
            raise Fail(f"ERROR - input list {args.input_list} is empty")
        for line in lines:
            if len(line) != len(names):
                raise Fail(f"ERROR - input list line {line} has {len(line)} files, the model has {len(names)} inputs")
            for name, path in zip(names, line):
                size = _existing(path, "calibration file").stat().st_size
                expected = 4 * int(__import__("math").prod(shapes[name]))
                if args.use_native_input_files and size != expected:
                    raise Fail(f"ERROR - {path}: {size} bytes, input {name} needs {expected}")
        print(f"INFO - Quantizing with {len(lines)} calibration samples: act {args.act_bitwidth} bit, "
              f"weights {args.weights_bitwidth or 8} bit, bias {args.bias_bitwidth} bit")
        if os.environ.get("FAKE_QAIRT_WARNING"):
            print("WARNING - Quantization encodings of tensor 'stand_in_tensor' were clipped to the calibrated range")
    elif args.float_bitwidth == 16:
        print("INFO - Converting float tensors to fp16")

    output = Path(args.output_path or onnx_path.with_suffix(".cpp"))
    output.parent.mkdir(parents=True, exist_ok=True)
    stem = output.with_suffix("")
    graph = _qnn_name(stem.name)
    command = "qnn-onnx-converter " + " ".join(argv)

    def qnn_dims(name, dims):
        layout = layouts.get(name) or DEFAULT_LAYOUT.get(len(dims))
        permutation = CHANNEL_LAST.get(layout)
        return [dims[i] for i in permutation] if permutation else dims

    tensors = {_qnn_name(n): {"type": 0, "dims": qnn_dims(n, shapes[n])} for n in names}
    for out in model.graph.output:
        dims = [d.dim_value for d in out.type.tensor_type.shape.dim]
        tensors[_qnn_name(out.name)] = {"type": 1, "dims": qnn_dims(None, dims)}
    output.write_text(f"// stand-in qnn-onnx-converter output\n// graph: {graph}\n// source: {onnx_path.resolve()}\n"
                      f"// command: {command}\n")
    weights = hashlib.sha256(onnx_path.read_bytes() + command.encode()).hexdigest()
    Path(f"{stem}.bin").write_text(f"stand-in weights {weights}\n")
    Path(f"{stem}_net.json").write_text(json.dumps({
        "model.cpp": str(output), "model.bin": f"{stem}.bin", "converter_command": command, "op_types": ops,
        "graph": {"tensors": tensors}}, indent=1))
    print(f"INFO - Model CPP saved at: {output}")
    return 0


def main_model_lib_generator(argv: list[str]) -> int:
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


def main_context_binary_generator(argv: list[str]) -> int:
    p = _parser("qnn-context-binary-generator")
    p.add_argument("--backend", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--binary_file", required=True)
    p.add_argument("--model_prefix")
    p.add_argument("--output_dir", default="./output")
    p.add_argument("--config_file")
    p.add_argument("--log_level", choices=("error", "warn", "info", "verbose", "debug"))
    args = p.parse_args(argv)
    backend = _existing(args.backend, "backend")
    if backend.name != "libQnnHtp.so":
        raise Fail(f"ERROR - stand-in: only the HTP backend is known, got {backend}")
    lib_text = _existing(args.model, "model library").read_text()
    graph = re.search(r"^// graph: (\S+)$", lib_text, re.M).group(1)
    soc = {"soc_type": "UNKNOWN", "arch": "68", "vtcm_size": 0}
    if args.config_file:
        extensions = _read_json(args.config_file, "config file")["backend_extensions"]
        _existing(extensions["shared_library_path"], "backend extensions library")
        config = _read_json(extensions["config_file_path"], "backend config")
        graph_config, device = config["graphs"][0], config["devices"][0]
        if graph not in graph_config["graph_names"]:
            raise Fail(f"ERROR - graph {graph} of {args.model} is not in graph_names {graph_config['graph_names']}")
        if not isinstance(device["soc_id"], int) or not re.fullmatch(r"v\d\d", device["dsp_arch"]):
            raise Fail(f"ERROR - bad device config {device}")
        soc = {"soc_type": SOC_NAMES.get(device["soc_id"], f"UNKNOWN({device['soc_id']})"),
               "arch": device["dsp_arch"][1:], "vtcm_size": graph_config["vtcm_mb"] * 1024 * 1024}
    out = Path(args.output_dir) / f"{args.binary_file}.bin"
    out.parent.mkdir(parents=True, exist_ok=True)
    config_string = f"soc_type={soc['soc_type']};arch={soc['arch']};vtcm_size={soc['vtcm_size']};"
    out.write_bytes(b"STAND-IN QNN CONTEXT BINARY\0" + config_string.encode() + b"\0" + lib_text.encode())
    print(f"Saved context binary {out}")
    return 0


def main_net_run(argv: list[str]) -> int:
    """Runs the float ONNX model the binary was converted from, with QNN-layout raw files in and out."""
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
    if not (args.model or args.retrieve_context):
        raise Fail("ERROR - one of --model or --retrieve_context is required")
    text = _existing(args.retrieve_context or args.model, "model").read_bytes().decode(errors="replace")
    source = re.search(r"^// source: (.+)$", text, re.M).group(1)
    import numpy as np
    import onnxruntime as ort
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])

    def permutation(dims):
        return CHANNEL_LAST.get(DEFAULT_LAYOUT.get(len(dims), ""))

    for index, line in enumerate(l.split() for l in Path(args.input_list).read_text().splitlines() if l.strip()):
        feed = {}
        for spec, path in zip(session.get_inputs(), line):
            dims = list(spec.shape)
            perm = permutation(dims)
            qnn_dims = [dims[i] for i in perm] if perm else dims
            data = np.fromfile(path, dtype=np.float32).reshape(qnn_dims)
            feed[spec.name] = data.transpose(np.argsort(perm)) if perm else data
        for spec, value in zip(session.get_outputs(), session.run(None, feed)):
            perm = permutation(value.shape)
            out = Path(args.output_dir) / f"Result_{index}" / f"{_qnn_name(spec.name)}.raw"
            out.parent.mkdir(parents=True, exist_ok=True)
            np.ascontiguousarray(value.transpose(perm) if perm else value).astype(np.float32).tofile(out)
    return 0


MAINS = {"qnn-onnx-converter": main_converter, "qnn-model-lib-generator": main_model_lib_generator,
         "qnn-context-binary-generator": main_context_binary_generator, "qnn-net-run": main_net_run}


def main(tool: str, argv: list[str]) -> int:
    _record(tool, argv)
    try:
        return MAINS[tool](argv)
    except Fail as e:
        print(e, file=sys.stderr)
        return 1

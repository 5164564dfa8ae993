"""Run a compiled binary by hand on the x86 HTP emulator: `python -m build_rules run <ctx.onnx|bin> --input x=x.npy`.

onnxruntime-qnn 2.7 is an execution-provider *plugin*: `providers=["QNNExecutionProvider"]` fails until its library
is registered with onnxruntime (toolchains/ort_qnn.py's _ort() does that, once per process). Two kinds of file:
- <graph>_ctx.onnx, the EPContext model the compile stage writes beside each binary: float inputs and outputs (the
  graph-I/O Quantize/DequantizeLinear nodes run on the CPU around the binary), as an ONNX Runtime app sees it;
- <graph>.bin, the raw QNN context binary a phone loads: its I/O is fixed point (uint8/uint16 with a scale and an
  offset). It runs through an EPContext wrapper typed by the binary's contract, as `python -m build_rules.dist
  verify` runs bundles (dist.py); the contract comes from the <graph>_ctx.onnx beside it. A float32 input is
  quantized with the contract's scale and offset (said on the console); --dequantize writes float outputs.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from .errors import did_you_mean
from .plumbing.native_stderr import EMULATOR_NOISE, captured


class RunError(Exception):
    """Bad input for `run`: names the file, the input or the output and what to do."""


ONNX_NUMPY = {1: "float32", 10: "float16", 11: "float64", 6: "int32", 7: "int64", 2: "uint8", 3: "int8", 4: "uint16",
              5: "int16", 12: "uint32", 9: "bool"}


class Binary:
    """A compiled model opened on the emulator: its inputs and outputs ({name: (dtype, shape, tensor)}) and run()."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.notes: list[str] = []
        self._tmp = None
        if not self.path.is_file():
            raise RunError(f"{self.path}: no such file (a <graph>_ctx.onnx or <graph>.bin from out/<model>/<variant>/"
                           "<chip>/, or a bundle's <chip>/ folder)")
        if self.path.suffix == ".bin":
            self._open_bare()
        elif self.path.suffix == ".onnx":
            self._open_ctx()
        else:
            raise RunError(f"{self.path}: expected a <graph>_ctx.onnx (EPContext model) or a <graph>.bin (QNN "
                           "context binary)")

    def _open_ctx(self) -> None:
        import onnx

        from .toolchains import ort_qnn
        try:
            model = onnx.load(str(self.path), load_external_data=False)
        except Exception as e:
            raise RunError(f"{self.path}: not an ONNX model ({type(e).__name__}: {e})") from None
        if not any(n.op_type == "EPContext" for n in model.graph.node):
            raise RunError(f"{self.path} is a plain ONNX model, not a compiled one (no EPContext node): run "
                           "`doit compile:...` and pass its <graph>_ctx.onnx")
        initializers = {i.name for i in model.graph.initializer}
        self.inputs = {v.name: (ONNX_NUMPY.get(v.type.tensor_type.elem_type, "?"), _dims(v), None)
                       for v in model.graph.input if v.name not in initializers}
        self.outputs = {v.name: (ONNX_NUMPY.get(v.type.tensor_type.elem_type, "?"), _dims(v), None)
                        for v in model.graph.output}
        self._run = ort_qnn.open_context_binary(self.path)

    def _open_bare(self) -> None:
        from . import dist
        from .toolchains import ort_qnn
        ctx = self.path.with_name(f"{self.path.stem}_ctx.onnx")
        if not ctx.is_file():
            raise RunError(f"{self.path}: its I/O contract (names, fixed-point types, scales, offsets) is read from "
                           f"{ctx.name} beside it, which is missing; the compile stage writes both (a qairt binary "
                           "has no _ctx.onnx and does not run on this emulator)")
        try:
            contract = dist.contract_from_ctx(ctx)
        except dist.DistError as e:
            raise RunError(str(e)) from None
        self._tmp = tempfile.TemporaryDirectory(prefix="build-rules-run-")
        wrapper = dist._bare_binary_model(ctx, self.path, contract, Path(self._tmp.name))
        self.inputs = {t["name"]: (dist.NUMPY_DTYPES[t["dtype"]], t["shape"], t) for t in contract["inputs"]}
        self.outputs = {t["name"]: (dist.NUMPY_DTYPES[t["dtype"]], t["shape"], t) for t in contract["outputs"]}
        self._run = ort_qnn.open_context_binary(wrapper)

    def check(self, feed: dict) -> dict:
        """The arrays to run with, each checked against the input it is for (and quantized for a bare binary)."""
        import numpy as np

        from . import dist
        for name in feed:
            if name not in self.inputs:
                raise RunError(f"--input {name}=...: {self.path.name} has no input '{name}' (inputs: "
                               f"{self.describe(self.inputs)}){did_you_mean(name, self.inputs)}")
        missing = [n for n in self.inputs if n not in feed]
        if missing:
            raise RunError("missing " + ", ".join(f"--input {n}=FILE.npy ({self._spec(self.inputs[n])})"
                                                  for n in missing))
        checked = {}
        for name, array in feed.items():
            dtype, shape, tensor = self.inputs[name]
            array = np.asarray(array)
            if list(array.shape) != list(shape):
                raise RunError(f"input '{name}' is {array.dtype}{list(array.shape)}, {self.path.name} takes "
                               f"{self._spec(self.inputs[name])}")
            if array.dtype == np.dtype(dtype):
                checked[name] = np.ascontiguousarray(array)
            elif tensor is not None and tensor["scale"] is not None and array.dtype == np.float32:
                checked[name] = dist.quantize(array, tensor)
                self.notes.append(f"input '{name}': float32 quantized to {dtype} with scale {tensor['scale']:.6g} "
                                  f"and offset {tensor['offset']} (QNN: real = scale * (q + offset))")
            else:
                accepted = dtype + (" (or float32, quantized with its scale and offset)"
                                    if tensor is not None and tensor["scale"] is not None else "")
                raise RunError(f"input '{name}' is {array.dtype}{list(array.shape)}, {self.path.name} takes "
                               f"{accepted}{list(shape)}: save it with .astype(np.{dtype})")
        return checked

    def run(self, feed: dict, dequantize: bool = False) -> dict:
        from . import dist
        outputs = self._run(self.check(feed))
        if dequantize:
            outputs = {n: dist.dequantize(v, self.outputs[n][2]).astype("float32")
                       if self.outputs[n][2] is not None and self.outputs[n][2]["scale"] is not None else v
                       for n, v in outputs.items()}
        return outputs

    def _spec(self, spec) -> str:
        dtype, shape, tensor = spec
        extra = f", scale {tensor['scale']:.6g} offset {tensor['offset']}" if tensor and tensor["scale"] else ""
        return f"{dtype}{list(shape)}{extra}"

    def describe(self, specs: dict) -> str:
        return ", ".join(f"{n} {self._spec(s)}" for n, s in specs.items())

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()


def _dims(value) -> list:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param or "?" for d in value.type.tensor_type.shape.dim]


def _file_name(output: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in output) + ".npy"


def read_inputs(items: list[str]) -> dict:
    import numpy as np
    feed = {}
    for item in items:
        name, sep, file = item.partition("=")
        if not sep or not name or not file:
            raise RunError(f"--input {item!r}: expected NAME=FILE.npy")
        if name in feed:
            raise RunError(f"--input {name}=... given twice")
        try:
            feed[name] = np.load(file, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise RunError(f"--input {name}={file}: cannot read a .npy array from it ({e})") from None
    return feed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m build_rules run",
        description="Run a compiled binary on the x86 HTP emulator (onnxruntime-qnn) and save its outputs as .npy.")
    parser.add_argument("binary", type=Path, help="<graph>_ctx.onnx (float I/O) or <graph>.bin (fixed-point I/O)")
    parser.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                        help="one per graph input (np.save of an array of the input's shape and dtype)")
    parser.add_argument("--output-dir", type=Path, default=None,
                        help="where <output>.npy files go (default: ./<binary name>.outputs/)")
    parser.add_argument("--dequantize", action="store_true",
                        help="a .bin's fixed-point outputs as float32 (dequantized with each output's scale and "
                             "offset)")
    args = parser.parse_args(argv)
    binary = None
    try:
        feed = read_inputs(args.input)
        native: list[str] = []
        try:
            with captured(fd=1) as native:  # what the emulator prints itself, shown after, but its per-session line
                binary = Binary(args.binary)
                started = time.perf_counter()
                outputs = binary.run(feed, args.dequantize)
                seconds = time.perf_counter() - started
        finally:
            for line in native:
                if not line.startswith(EMULATOR_NOISE):
                    print(line)
        for note in binary.notes:
            print(note)
        folder = args.output_dir or Path(f"{args.binary.name}.outputs")
        folder.mkdir(parents=True, exist_ok=True)
        import numpy as np
        print(f"ran {args.binary} on the HTP emulator (x86) in {seconds:.2f} s:")
        for name, value in outputs.items():
            path = folder / _file_name(name)
            np.save(path, value)
            print(f"  {name}: {value.dtype}{list(value.shape)} -> {path}")
        return 0
    except (RunError, ModuleNotFoundError) as e:  # ModuleNotFoundError: onnxruntime-qnn is not installed
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        if binary is not None:
            binary.close()

"""What a device task runs for one graph, in one form whichever toolchain made the binaries: its parts in order (an
unsplit graph is one part; a split graph one context binary per part, docs/split.md), each with its I/O contract,
and how a graph's evaluation inputs become the files qnn-net-run reads and its outputs become arrays again.

A graph's target (the task generators write it, tasks/device.py):
  {"toolchain": "ort-qnn" | "qairt", "flow": the qairt flow or None, "inputs": {name: {"shape", "dtype", "layout"}},
   "outputs": [names], "parts": [{"name": "<graph>" or "<graph>.part<k>", "binary": path, "contract": path}]}
contract: ort-qnn's <part>_ctx.onnx (dist.contract_from_ctx); qairt's <graph>_net.json or <graph>.info.json
(qairt_outputs.read_io_contract), whose tensors are named as QNN names them and may be channel-last
(qairt.qnn_permutation: the model-lib flow's converter moves a channel-first input's channel axis last).

Every part reads and writes float32 raw files (qnn-net-run's default: it quantizes float inputs with the binary's
encodings and dequantizes outputs), `Result_<n>/<qnn name>.raw`; or, with `native` (profile: what an app feeds,
qnn-net-run --use_native_input_files / --use_native_output_files), raw files in the binary's own I/O types (e.g.
uint16 fixed point), quantized and dequantized here on the host with the contract's scale and offset. A tensor
crossing a cut is an output of one part and an input of a later one under the same name; it goes back through the
host between the parts (pulled, read through the first part's contract, written through the next one's), as the app
hands it on.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import BuildError


@dataclass
class Tensor:
    name: str  # as the ONNX graph names it (the evaluation's keys)
    qnn_name: str  # as the binary names it (input_list entries, Result_<n>/<qnn_name>.raw)
    shape: list  # on the QNN side
    permutation: tuple | None = None  # ONNX axes -> QNN axes (None: the same order)
    encoding: dict | None = None  # the contract's dtype/scale/offset (ort-qnn), for native I/O; None: float32 only


@dataclass
class Part:
    name: str
    binary: str
    inputs: list  # [Tensor]
    outputs: list  # [Tensor]


def parts(where: str, target: dict) -> list[Part]:
    """The graph's parts with their contracts read; a contract that does not name a tensor fails naming both."""
    found = []
    for part in target["parts"]:
        if target["toolchain"] == "qairt":
            found.append(_qairt_part(where, target, part))
        else:
            found.append(_ort_part(part))
    return found


def _ort_part(part: dict) -> Part:
    from ..bundles.dist_contract import contract_from_ctx
    contract = contract_from_ctx(part["contract"])

    def tensors(entries):
        return [Tensor(t["name"], t["qnn_name"], list(t["shape"]), encoding={k: t[k] for k in ("dtype", "scale",
                                                                                            "offset")})
                for t in entries]
    return Part(part["name"], part["binary"], tensors(contract["inputs"]), tensors(contract["outputs"]))


def _qairt_part(where: str, target: dict, part: dict) -> Part:
    from ..toolchains import qairt
    from ..toolchains.qairt_outputs import ContractError, find_tensor, read_io_contract
    try:
        contract = read_io_contract(part["contract"])
    except ContractError as e:
        raise BuildError(f"{where}: {e}") from None

    def entry(kind: str, name: str) -> dict:
        found = find_tensor(contract[kind], name)
        if found is None:
            raise BuildError(f"{where}: {kind[:-1]} '{name}' is not in {part['contract']} (the binary's I/O "
                             f"contract: {', '.join(e['name'] for e in contract[kind])}): build the variant again")
        return found
    inputs = []
    for name, spec in target["inputs"].items():
        found = entry("inputs", name)
        inputs.append(Tensor(name, found["name"], list(found["shape"]), qairt.qnn_permutation(spec, target["flow"])))
    outputs = [Tensor(name, entry("outputs", name)["name"], list(entry("outputs", name)["shape"]))
               for name in target["outputs"]]
    return Part(part["name"], part["binary"], inputs, outputs)


def result_file(folder: Path, index: int, qnn_name: str) -> Path:
    """Where qnn-net-run's output for `qnn_name` is read: under Result_<n>/ whatever the name holds. A name with
    slashes (torchscript's "/conv1/Conv_output_0") is taken as a path below Result_<n>, as a C++ string join of
    folder and name gives (assumed for the real qnn-net-run, not verified on a phone; the stand-in does so); never
    as an absolute path (`folder / "/x.raw"` is /x.raw on this machine: every sample's output in one file)."""
    return Path(f"{folder}/Result_{index}/{qnn_name}.raw")


def safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def native_io(parts: list[Part]) -> bool:
    """Whether every tensor of every part has the encoding native raw files need (ort-qnn contracts do)."""
    return all(t.encoding is not None for p in parts for t in (*p.inputs, *p.outputs))


def write_inputs(where: str, part: Part, samples: list[dict], folder: Path, remote: str, native: bool = False) -> dict:
    """float32 raw files (QNN layout), or with `native` the binary's own input types, + input_list.txt of
    `<qnn name>:=<remote path>` lines, one per sample. Returns remote path -> local file."""
    import numpy as np

    from ..bundles.dist_contract import quantize
    folder.mkdir(parents=True, exist_ok=True)
    files, lines = {}, []
    for i, sample in enumerate(samples):
        entries = []
        for tensor in part.inputs:
            if tensor.name not in sample:
                raise BuildError(f"{where}: no value for input '{tensor.name}' of {part.name} (neither the evaluation "
                                 "set nor an earlier part gives it): run `doit verify` again")
            array = np.asarray(sample[tensor.name], dtype=np.float32)
            if tensor.permutation:
                array = array.transpose(tensor.permutation)
            if native:
                array = quantize(array, tensor.encoding)
            name = f"{i:04d}.{safe(tensor.name)}.raw"
            np.ascontiguousarray(array).tofile(folder / name)
            files[f"{remote}/{name}"] = folder / name
            entries.append(f"{tensor.qnn_name}:={remote}/{name}")
        lines.append(" ".join(entries))
    (folder / "input_list.txt").write_text("\n".join(lines) + "\n")
    files[f"{remote}/input_list.txt"] = folder / "input_list.txt"
    return files


def read_outputs(where: str, part: Part, folder: Path, count: int, shapes: dict | None = None,
                 native: bool = False) -> list[dict]:
    """Result_<n>/<qnn name>.raw of `count` samples as arrays; `shapes` (ONNX shapes by name, e.g. the reference's)
    turns a channel-last output back (qairt_check's rule); `native` files are in the binary's output types and are
    dequantized to float32."""
    import numpy as np

    from ..bundles.dist_contract import NUMPY_DTYPES, dequantize
    from ..stages.qairt_check import _to_onnx_layout
    outputs = []
    for i in range(count):
        result = {}
        for tensor in part.outputs:
            path = result_file(folder, i, tensor.qnn_name)
            shown = path.relative_to(folder)  # Result_<n>/<name>.raw as the phone has it (no doubled slash)
            if not path.is_file():
                raise BuildError(f"{where}: qnn-net-run on the phone wrote no {shown} (output '{tensor.name}' of "
                                 f"{part.name})")
            if native:
                data = dequantize(np.fromfile(path, dtype=NUMPY_DTYPES[tensor.encoding["dtype"]]),
                                  tensor.encoding).astype(np.float32)
            else:
                data = np.fromfile(path, dtype=np.float32)
            try:
                if shapes and tensor.name in shapes:
                    result[tensor.name] = _to_onnx_layout(data, tensor.shape, tuple(shapes[tensor.name]))
                elif data.size == int(np.prod(tensor.shape)):
                    result[tensor.name] = data.reshape(tensor.shape)
                else:
                    raise ValueError(f"{data.size} {tensor.encoding['dtype'] if native else 'float32'} values, the "
                                     f"contract says shape {tensor.shape}")
            except ValueError as e:
                raise BuildError(f"{where}: {shown} (output '{tensor.name}' of {part.name}): {e}") from None
        outputs.append(result)
    return outputs

"""Stage 7 (qairt), check: run a context binary with qnn-net-run on the x86 HTP backend (the emulator) over the
held-out evaluation inputs and compare with the float model, like the ort-qnn check (same metrics and gate).

Inputs go in as float32 raw files in QNN layout (channel-last where qnn-onnx-converter made them so, the ONNX
layout in the DLC flow), listed by name (`name:=path`, the graph's input names from its I/O contract), so their
order cannot be mixed up. Outputs come back as float32 raw files Result_<n>/<output>.raw, shaped by the dims in
the I/O contract (<graph>_net.json, or the DLC flow's <graph>.info.json) and turned back to the ONNX layout. An
SDK without bin/x86_64-linux-clang/qnn-net-run cannot run anything: the report then says "not run" and holds no
metrics, rather than numbers that were never measured.

Another chip than the reference (params["reference"]) proves its outputs equal to the reference chip's on a few
samples with qnn-net-run and takes the reference's metrics, as the ort-qnn check does (check.prove_equal; docs/qairt.md).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..errors import BuildError
from ..plumbing.files import atomic_write_json
from ..toolchains.sdk_tool import run_tool, short, tail


def _to_onnx_layout(data, dims: list[int] | None, shape: tuple[int, ...]):
    """A QNN output (flat) back in the ONNX output's shape, undoing a channel-last move of the channel axis."""
    import numpy as np

    from ..toolchains.qairt import TO_CHANNEL_LAST
    if data.size != int(np.prod(shape)):
        raise ValueError(f"{data.size} values, the float model's output has shape {list(shape)}")
    if dims and tuple(dims) != tuple(shape):
        for permutation in TO_CHANNEL_LAST.values():
            if len(permutation) == len(shape) and tuple(shape[i] for i in permutation) == tuple(dims):
                return data.reshape(dims).transpose(np.argsort(permutation))
    return data.reshape(shape)


def run(params: dict) -> dict:
    from ..toolchains import qairt

    sdk = qairt.Sdk(Path(params["sdk"]))
    report_path = Path(params["outputs"]["report"])
    if not params["net_run"]:
        reason = f"not run: no qnn-net-run in {sdk.tool('qnn-net-run').parent}"
        print(reason, flush=True)
        atomic_write_json(report_path, {"status": "not run", "reason": reason, "summary": {},
                                        "gates": params["gates"]})
        return {"status": "not run"}

    from .check import decide, measure, measurement_key, prove_equal, reference_metrics
    from ..measuring.samples import load_evaluation, load_labels

    inputs, reference = load_evaluation(params["evaluation"])
    work = report_path.parent / f".{params['graph']}.net_run"  # inside the stage's staging folder
    contracts = {params["binary"]: params["io"]}
    if params.get("reference"):
        contracts[params["reference"]["ctx_model"]] = params["reference"]["io"]

    def run(binary: str, samples: list[dict]) -> list[dict]:
        return _net_run(params, sdk, binary, contracts[binary], samples, reference[:len(samples)], work)

    def measure_binary(binary: str) -> dict:
        return measure(params["hooks"], params["graph"], params.get("data_dir"), inputs, reference, run(binary, inputs),
                       load_labels(params["evaluation"]))

    proof = None
    if params.get("reference"):  # another chip: equal outputs on a few samples take the reference's metrics
        proving = {**params, "ctx_model": params["binary"]}
        proof = prove_equal(proving, run)
        if proof["equal"]:
            metrics, key = reference_metrics(proving, lambda: measure_binary(params["reference"]["ctx_model"]))
            return _ran(report_path, decide(params, metrics, key, proof))
    key = measurement_key(params["binary"], params["evaluation"], params["hooks"], params.get("data_dir"))
    return _ran(report_path, decide(params, measure_binary(params["binary"]), key, proof))


def _ran(report_path: Path, values: dict) -> dict:
    report = json.loads(report_path.read_text())
    report.update(status="ran", runner="qnn-net-run (x86_64 HTP emulator)")
    atomic_write_json(report_path, report)
    return values


def _net_run(params: dict, sdk, binary: str, io: str, inputs: list[dict], reference: list[dict],
             work: Path) -> list[dict]:
    """The outputs of one context binary with qnn-net-run over `inputs` (in the ONNX layout, like `reference`)."""
    import numpy as np

    from ..toolchains import qairt
    from ..toolchains.qairt_outputs import ContractError, find_tensor, read_io_contract
    try:
        contract = read_io_contract(io)
    except ContractError as e:
        raise BuildError(f"{params['name']}: {e}") from None
    qnn_inputs = {}
    for name in params["inputs"]:
        entry = find_tensor(contract["inputs"], name)
        if entry is None:
            raise BuildError(f"{params['name']}: input '{name}' is not in {io}")
        qnn_inputs[name] = entry["name"]
    shutil.rmtree(work, ignore_errors=True)
    (work / "inputs").mkdir(parents=True)
    lines = []
    for i, sample in enumerate(inputs):
        entries = []
        for name, spec in params["inputs"].items():
            permutation = qairt.qnn_permutation(spec, params["flow"])
            array = sample[name].astype(np.float32)
            if permutation:
                array = array.transpose(permutation)
            path = work / "inputs" / f"{i:04d}.{qairt.qnn_tensor_name(name)}.raw"
            np.ascontiguousarray(array).tofile(path)
            entries.append(f"{qnn_inputs[name]}:={path}")
        lines.append(" ".join(entries))
    input_list = work / "input_list.txt"
    input_list.write_text("\n".join(lines) + "\n")
    print(f"qnn-net-run: {binary} on {len(inputs)} sample(s)", flush=True)
    print(f"input list, first line: {lines[0]}", flush=True)
    cmd = qairt.net_run_command(sdk, binary, short(input_list), short(work / "output"))
    code, text = run_tool(cmd, sdk)
    if code != 0:
        raise BuildError(f"{params['name']}: qnn-net-run failed with exit code {code}:\n{tail(text)}")
    outputs = []
    for i, expected in enumerate(reference):
        result = {}
        for name, ref in expected.items():
            entry = find_tensor(contract["outputs"], name)
            qnn_name = entry["name"] if entry else qairt.qnn_tensor_name(name)
            found = work / "output" / f"Result_{i}" / f"{qnn_name}.raw"
            if not found.is_file():
                raise BuildError(f"{params['name']}: qnn-net-run wrote no {found.relative_to(work)}")
            try:
                result[name] = _to_onnx_layout(np.fromfile(found, dtype=np.float32), entry and entry["shape"],
                                               ref.shape)
            except ValueError as e:
                raise BuildError(f"{params['name']}: output {name} of qnn-net-run: {e}") from None
        outputs.append(result)
    return outputs

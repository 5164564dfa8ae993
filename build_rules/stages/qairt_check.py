"""Stage 7 (qairt), check: run a context binary with qnn-net-run on the x86 HTP backend (the emulator) over the
held-out evaluation inputs and compare with the float model, like the ort-qnn check (same metrics and gate).

Inputs go in as float32 raw files in QNN layout (channel-last where the converter made them so); outputs come
back as float32 raw files Result_<n>/<output>.raw, shaped by the dims in <graph>_net.json and turned back to
the ONNX layout. An SDK without bin/x86_64-linux-clang/qnn-net-run cannot run anything: the report then says
"not run" and holds no metrics, rather than numbers that were never measured.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from ..errors import BuildError
from ..files import atomic_write_json
from .sdk_tool import run_tool, short, tail

VERSION = 1


def _qnn_name(name: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return f"_{name}" if name[:1].isdigit() else name


def _to_onnx_layout(data, dims: list[int] | None, shape: tuple[int, ...]):
    """A QNN output (flat) back in the ONNX output's shape, undoing a channel-last move of the channel axis."""
    import numpy as np

    from ..toolchains.qairt import _TO_CHANNEL_LAST
    if data.size != int(np.prod(shape)):
        raise ValueError(f"{data.size} values, the float model's output has shape {list(shape)}")
    if dims and tuple(dims) != tuple(shape):
        for permutation in _TO_CHANNEL_LAST.values():
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
                                        "gate": params["gate"]})
        return {"status": "not run"}

    import numpy as np

    from .check import judge
    from .common import load_evaluation

    inputs, reference = load_evaluation(params["evaluation"])
    work = report_path.parent / f".{params['graph']}.net_run"  # inside the stage's staging folder
    shutil.rmtree(work, ignore_errors=True)
    (work / "inputs").mkdir(parents=True)
    lines = []
    for i, sample in enumerate(inputs):
        paths = []
        for name, spec in params["inputs"].items():
            permutation = qairt.qnn_permutation(spec)
            array = sample[name].astype(np.float32)
            if permutation:
                array = array.transpose(permutation)
            path = work / "inputs" / f"{i:04d}.{_qnn_name(name)}.raw"
            np.ascontiguousarray(array).tofile(path)
            paths.append(str(path))
        lines.append(" ".join(paths))
    input_list = work / "input_list.txt"
    input_list.write_text("\n".join(lines) + "\n")
    cmd = qairt.net_run_command(sdk, params["binary"], short(input_list), short(work / "output"))
    code, text = run_tool(cmd)
    if code != 0:
        raise BuildError(f"{params['name']}: qnn-net-run failed with exit code {code}:\n{tail(text)}")
    tensors = json.loads(Path(params["net_json"]).read_text()).get("graph", {}).get("tensors", {})
    outputs = []
    for i, expected in enumerate(reference):
        result = {}
        for name, ref in expected.items():
            candidates = [work / "output" / f"Result_{i}" / f"{n}.raw" for n in (name, _qnn_name(name))]
            found = next((p for p in candidates if p.is_file()), None)
            if found is None:
                raise BuildError(f"{params['name']}: qnn-net-run wrote no {candidates[-1].relative_to(work)}")
            info = tensors.get(name) or tensors.get(_qnn_name(name)) or {}
            try:
                result[name] = _to_onnx_layout(np.fromfile(found, dtype=np.float32), info.get("dims"), ref.shape)
            except ValueError as e:
                raise BuildError(f"{params['name']}: output {name} of qnn-net-run: {e}") from None
        outputs.append(result)
    values = judge(params, inputs, reference, outputs)
    report = json.loads(report_path.read_text())
    report.update(status="ran", runner="qnn-net-run (x86_64 HTP emulator)")
    atomic_write_json(report_path, report)
    return values

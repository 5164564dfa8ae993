"""Stage 5 (qairt), convert: simplified ONNX -> <graph>.cpp, <graph>.bin, <graph>_net.json (qnn-onnx-converter).

Quantized variants are quantized by the converter itself from the shared calibration raw files (--input_list
--use_native_input_files). Channel-first inputs are channel-last on the QNN side, so their calibration samples
are handed over transposed (toolchains.qairt.qnn_permutation); an input declared `layout = "NTF"` keeps its order.
The converter's output is scanned: an unsupported op or an op left on the CPU fails the build, naming it;
quantization warnings are kept in <graph>.convert.json and listed in the manifest.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import BuildError
from ..files import atomic_write_json
from .sdk_tool import run_tool, short, tail

VERSION = 1


def qnn_input_list(params: dict, work: Path) -> str:
    """An input list in QNN layout with the variant's sample count: the shared one when it already is."""
    import numpy as np

    from ..toolchains import qairt

    count = params["variant"]["calibration_samples"]
    with open(params["input_list"]) as f:
        lines = [line.split() for line in f if line.strip()]
    if len(lines) < count:
        raise BuildError(f"{params['input_list']}: {len(lines)} calibration samples, "
                         f"{params['name']} needs {count}")
    specs = params["inputs"]
    permutations = {name: qairt.qnn_permutation(spec) for name, spec in specs.items()}
    if len(lines) == count and not any(permutations.values()):
        return params["input_list"]
    work.mkdir(parents=True, exist_ok=True)
    out_lines = []
    for i, line in enumerate(lines[:count]):
        paths = []
        for (name, spec), path in zip(specs.items(), line):
            permutation = permutations[name]
            if permutation is None:
                paths.append(str(Path(path).absolute()))
                continue
            array = np.fromfile(path, dtype=spec["dtype"]).reshape(spec["shape"])
            target = work / f"{i:04d}.{Path(path).name}"
            np.ascontiguousarray(array.transpose(permutation)).tofile(target)
            paths.append(str(target))
        out_lines.append(" ".join(paths))
    listed = work / "input_list.txt"
    listed.write_text("\n".join(out_lines) + "\n")
    print(f"calibration samples in QNN layout: {listed} ({count} samples; transposed: "
          f"{', '.join(f'{n} {p}' for n, p in permutations.items() if p) or 'none'})", flush=True)
    return str(listed)


def run(params: dict) -> dict:
    from ..toolchains import qairt

    sdk = qairt.Sdk(Path(params["sdk"]))
    outputs = params["outputs"]
    cpp = Path(outputs["cpp"])
    cpp.parent.mkdir(parents=True, exist_ok=True)
    variant = params["variant"]
    input_list = overrides = None
    if variant["precision"] != "fp16":
        input_list = qnn_input_list(params, cpp.parent / f".{params['graph']}.qnn_inputs")
        if "overrides" in outputs:
            overrides = outputs["overrides"]
            atomic_write_json(overrides, qairt.overrides_json(variant["overrides"]))
    cmd = qairt.converter_command(sdk, params["onnx"], short(cpp), params["inputs"], variant,
                                  input_list and short(input_list), overrides and short(overrides))
    code, text = run_tool(cmd)
    problems = qairt.scan_converter_log(text)
    where = f"{params['name']}: qnn-onnx-converter on {params['onnx']}"
    if problems["unsupported_ops"]:
        raise BuildError(f"{where}: unsupported op(s) {', '.join(problems['unsupported_ops'])} "
                         "(fix the export so QNN can convert them; the converter's output is in the log)")
    if problems["cpu_ops"]:
        raise BuildError(f"{where}: op(s) left on the CPU: " + "; ".join(problems["cpu_ops"][:5]))
    if code != 0:
        raise BuildError(f"{where} failed with exit code {code}:\n{tail(text)}")
    missing = [str(Path(outputs[k]).name) for k in ("cpp", "bin", "net_json") if not Path(outputs[k]).is_file()]
    if missing:
        raise BuildError(f"{where} exited 0 but did not write {', '.join(missing)}")
    try:
        net = json.loads(Path(outputs["net_json"]).read_text())
    except ValueError as e:
        raise BuildError(f"{where}: {Path(outputs['net_json']).name} is not JSON: {e}") from None
    report = {"command": cmd, "op_types": net.get("op_types"),
              "quantization_warnings": problems["quantization_warnings"]}
    atomic_write_json(outputs["report"], report)
    return {"quantization_warnings": len(problems["quantization_warnings"])}

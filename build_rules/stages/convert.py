"""Stage 5 (qairt, model-lib flow), convert: simplified ONNX -> <graph>.cpp, <graph>.bin, <graph>_net.json
(qnn-onnx-converter).

Quantized variants are quantized by the converter itself from the shared calibration raw files (--input_list
--use_native_input_files). Channel-first inputs are channel-last on the QNN side, so their calibration samples
are handed over transposed (toolchains.qairt.qnn_permutation); an input declared `layout = "NTF"` keeps its order.
After the run, each input's dims in <graph>_net.json must be the layout the samples were written in (else the
quantization was calibrated on scrambled data, and check would feed scrambled inputs): the stage fails naming it.
An op the converter cannot translate fails naming node, op type and fix; WARNING lines never fail; quantization
warnings are kept in <graph>.convert.json and listed in the manifest.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import BuildError
from ..plumbing.files import atomic_write_json
from ..toolchains.sdk_tool import check_converter_output, overrides_file, run_tool, short


def qnn_input_list(params: dict, work: Path, flow: str = "model-lib", absolute: bool = False) -> str:
    """An input list with the variant's sample count, in the layout the converter expects: the shared one when it
    already is. One path per input, in the ONNX input order (the order the converted graph is checked for);
    absolute: every path absolute (qairt-quantizer reads the list from its own working folder)."""
    import numpy as np

    from ..toolchains import qairt

    count = params["variant"]["calibration_samples"]
    with open(params["input_list"]) as f:
        lines = [line.split() for line in f if line.strip()]
    if len(lines) < count:
        raise BuildError(f"{params['input_list']}: {len(lines)} calibration samples, "
                         f"{params['name']} needs {count}")
    specs = params["inputs"]
    permutations = {name: qairt.qnn_permutation(spec, flow) for name, spec in specs.items()}
    if len(lines) == count and not any(permutations.values()) and not absolute:
        return params["input_list"]
    work.mkdir(parents=True, exist_ok=True)
    out_lines = []
    for i, line in enumerate(lines[:count]):
        paths = []
        for (name, spec), path in zip(specs.items(), line):
            permutation = permutations[name]
            target = Path(path).absolute()
            if permutation is not None:
                array = np.fromfile(path, dtype=spec["dtype"]).reshape(spec["shape"])
                target = work / f"{i:04d}.{Path(path).name}"
                np.ascontiguousarray(array.transpose(permutation)).tofile(target)
            paths.append(str(target))
        out_lines.append(" ".join(paths))
    listed = work / "input_list.txt"
    listed.write_text("\n".join(out_lines) + "\n")
    print(f"calibration samples for the converter: {listed} ({count} samples; transposed: "
          f"{', '.join(f'{n} {p}' for n, p in permutations.items() if p) or 'none'}), first line: {out_lines[0]}",
          flush=True)
    return str(listed)


def run(params: dict) -> dict:
    from ..toolchains import qairt
    from ..toolchains.qairt_outputs import ContractError, input_problems, read_io_contract

    sdk = qairt.Sdk(Path(params["sdk"]))
    outputs = params["outputs"]
    cpp = Path(outputs["cpp"])
    cpp.parent.mkdir(parents=True, exist_ok=True)
    variant = params["variant"]
    input_list = overrides = None
    if variant["precision"] != "fp16":
        input_list = qnn_input_list(params, cpp.parent / f".{params['graph']}.qnn_inputs")
        overrides = overrides_file(params)
    cmd = qairt.converter_command(sdk, params["onnx"], short(cpp), params["inputs"], variant,
                                  input_list and short(input_list), overrides, params["per_row"])
    code, text = run_tool(cmd, sdk)
    where = f"{params['name']}: qnn-onnx-converter on {params['onnx']}"
    found = check_converter_output(where, "qnn-onnx-converter", code, text, params["onnx"])
    missing = [str(Path(outputs[k]).name) for k in ("cpp", "bin", "net_json") if not Path(outputs[k]).is_file()]
    if missing:
        raise BuildError(f"{where} exited 0 but did not write {', '.join(missing)}")
    try:
        contract = read_io_contract(outputs["net_json"])
    except ContractError as e:
        raise BuildError(f"{where}: {e}") from None
    problems = input_problems(contract, params["inputs"], "model-lib")
    if problems:
        raise BuildError(f"{where}: " + "; ".join(problems) + ". Fix: declare the input's layout in model.toml "
                         f"([graphs.{params['graph']}] inputs = {{ <name> = {{ ..., layout = \"...\" }} }}) as the "
                         "ONNX model has it, so that the converter and this build agree (docs/qairt.md, Layouts)")
    report = {"command": cmd, "io": contract, "quantization_warnings": found["quantization_warnings"]}
    atomic_write_json(outputs["report"], report)
    return {"quantization_warnings": len(found["quantization_warnings"])}

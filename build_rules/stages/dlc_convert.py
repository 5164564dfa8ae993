"""Stage 5 (qairt, DLC flow), convert: simplified ONNX -> <graph>.dlc (qairt-converter).

The DLC is float (fp16 for an fp16 variant, --float_bitwidth 16); quantized variants are calibrated afterwards
by qairt-quantizer (stages/dlc_quantize.py), so their float DLC goes to float_dlc/<graph>.dlc and the quantized
one becomes <graph>.dlc: both carry the graph's name, whichever of the two files QNN takes it from.
qairt-converter keeps the ONNX layout of every input: no transposed data anywhere in this flow.
An op it cannot translate fails naming node, op type and fix; WARNING lines never fail.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import BuildError
from ..plumbing.files import atomic_write_json
from ..toolchains.sdk_tool import check_converter_output, overrides_file, run_tool, short


def run(params: dict) -> dict:
    from ..toolchains import qairt

    sdk = qairt.Sdk(Path(params["sdk"]))
    outputs = params["outputs"]
    dlc = Path(outputs["dlc"])
    dlc.parent.mkdir(parents=True, exist_ok=True)
    cmd = qairt.dlc_converter_command(sdk, params["onnx"], short(dlc), params["inputs"], params["variant"],
                                      overrides_file(params))
    code, text = run_tool(cmd, sdk)
    where = f"{params['name']}: qairt-converter on {params['onnx']}"
    found = check_converter_output(where, "qairt-converter", code, text, params["onnx"])
    if not dlc.is_file():
        raise BuildError(f"{where} exited 0 but did not write {dlc.name}")
    atomic_write_json(outputs["report"], {"command": cmd, "quantization_warnings": found["quantization_warnings"]})
    return {"bytes": dlc.stat().st_size}

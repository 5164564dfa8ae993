"""Stage 5b (qairt, DLC flow), quantize: float_dlc/<graph>.dlc -> <graph>.dlc (qairt-quantizer), calibrated on the
shared calibration raw files, which are in the ONNX layout this flow keeps.

The input list has one absolute path per input (the quantizer reads it from its own working folder), in the ONNX
input order: no `name:=path` entries, which a Qualcomm tool's docs say qairt-quantizer does not accept. A DLC's
input order could differ; compile checks the order of the compiled graph's inputs against it. Quantization
warnings go to <graph>.quantize.json and the manifest.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import BuildError
from ..plumbing.files import atomic_write_json
from .convert import qnn_input_list
from ..toolchains.sdk_tool import run_tool, short, tail


def run(params: dict) -> dict:
    from ..toolchains import qairt
    from ..toolchains.qairt_outputs import scan_converter_log

    sdk = qairt.Sdk(Path(params["sdk"]))
    outputs = params["outputs"]
    dlc = Path(outputs["dlc"])
    dlc.parent.mkdir(parents=True, exist_ok=True)
    input_list = qnn_input_list(params, dlc.parent / f".{params['graph']}.qnn_inputs", flow="dlc", absolute=True)
    cmd = qairt.dlc_quantizer_command(sdk, params["float_dlc"], short(dlc), input_list, params["variant"],
                                      params["per_row"])
    code, text = run_tool(cmd, sdk)
    where = f"{params['name']}: qairt-quantizer on {params['float_dlc']}"
    if code != 0:
        raise BuildError(f"{where} failed with exit code {code}:\n{tail(text)}")
    if not dlc.is_file():
        raise BuildError(f"{where} exited 0 but did not write {dlc.name}")
    warnings = scan_converter_log(text)["quantization_warnings"]
    atomic_write_json(outputs["report"], {"command": cmd, "quantization_warnings": warnings})
    return {"quantization_warnings": len(warnings)}

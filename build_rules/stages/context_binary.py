"""Stage 6 (qairt), compile: the graph + the chip's HTP config -> <chip>/<graph>.bin (qnn-context-binary-generator
on the x86 libQnnHtp.so backend, the binary a phone loads).

The graph comes from the x86_64 model library (model-lib flow) or from <graph>.dlc through libQnnModelDlc.so
(DLC flow). In the DLC flow the binary's I/O is then read back with qnn-context-binary-utility into
<graph>.info.json (there is no _net.json), and each input must have its ONNX shape (the flow keeps layouts) and
place (the quantizer's calibration list is in ONNX input order).
A node HTP refuses fails the task naming node, op type, the generator's reason and a fix.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import BuildError
from ..toolchains.sdk_tool import onnx_nodes, run_tool, short, tail


def rejection_error(name: str, rejected: list[dict], onnx_path: str | None, dsp_arch: str) -> BuildError:
    """One message for the nodes HTP refused, named as in the ONNX model where the model has them."""
    from ..toolchains.qairt import qnn_tensor_name
    from ..toolchains.qairt_outputs import htp_fix, rejection_message

    by_name = {}
    try:
        for node, op in onnx_nodes(onnx_path) if onnx_path else []:
            by_name.setdefault(node, (node, op))
            by_name.setdefault(qnn_tensor_name(node), (node, op))
    except Exception as e:  # naming is a courtesy: the failure itself must still be reported
        print(f"note: could not read {onnx_path} to name the rejected nodes: {e}", flush=True)
    messages = []
    for r in rejected[:5]:
        node, op_type = by_name.get(r["node"], (r["node"], r["op_type"] or "op type not in the log"))
        messages.append(rejection_message(node, op_type, f"{r['text']} (error {r['code']})", htp_fix(r["text"], dsp_arch)))
    more = f" (and {len(rejected) - 5} more nodes)" if len(rejected) > 5 else ""
    return BuildError(f"{name}: qnn-context-binary-generator: " + "; ".join(messages) + more)


def run(params: dict) -> dict:
    from ..toolchains import qairt
    from ..toolchains.qnn_binary import read_binary_target
    from ..toolchains.qairt_outputs import (ContractError, binary_graph_names, input_problems, read_io_contract,
                                            scan_context_binary_log)

    sdk = qairt.Sdk(Path(params["sdk"]))
    binary = Path(params["outputs"]["binary"])
    binary.parent.mkdir(parents=True, exist_ok=True)
    chip = params["chip"]
    cmd = qairt.context_binary_command(sdk, short(binary.parent), binary.stem, params["config_file"],
                                       model_lib=params.get("model_lib"), dlc=params.get("dlc"))
    code, text = run_tool(cmd, sdk)
    rejected = scan_context_binary_log(text)
    if rejected:
        raise rejection_error(params["name"], rejected, params.get("onnx"), chip["dsp_arch"])
    if code != 0:
        raise BuildError(f"{params['name']}: qnn-context-binary-generator failed with exit code {code}:\n"
                         f"{tail(text)}")
    if not binary.is_file():
        raise BuildError(f"{params['name']}: qnn-context-binary-generator exited 0 but wrote no {binary.name}")
    if "info" in params["outputs"]:  # DLC flow: what the binary's graph takes and gives
        info = Path(params["outputs"]["info"])
        code, text = run_tool(qairt.binary_info_command(sdk, short(binary), short(info)), sdk)
        if code != 0 or not info.is_file():
            raise BuildError(f"{params['name']}: qnn-context-binary-utility could not read {binary.name} "
                             f"(exit code {code}):\n{tail(text)}")
        try:
            problems = input_problems(read_io_contract(info), params["inputs"], "dlc")
            names = binary_graph_names(info)
        except ContractError as e:
            raise BuildError(f"{params['name']}: {e}") from None
        if names != [params["graph_name"]]:  # the chip's HTP config (graph_names) did not apply to this graph
            raise BuildError(f"{params['name']}: {binary.name} holds graph(s) {names}, but the HTP config names "
                             f"'{params['graph_name']}', so the chip's settings were not applied to it. Fix: report "
                             "this SDK's DLC graph naming; until then use the model-lib flow (qairt_flow = "
                             "\"model-lib\")")
        if problems:
            raise BuildError(f"{params['name']}: " + "; ".join(problems) + " (the DLC flow writes every input "
                             "in its ONNX layout and order). Fix: use the model-lib flow for this model "
                             "(qairt_flow = \"model-lib\"), and report this SDK's behaviour")
    try:
        target = read_binary_target(binary)  # the HTP config string a context binary embeds
    except ValueError:
        print(f"note: {binary.name} has no readable embedded HTP config; chip and arch not verified", flush=True)
        return {"bytes": binary.stat().st_size, "target": None}
    if target.get("soc_type") != chip["name"] or str(target.get("arch")) != chip["dsp_arch"][1:]:
        raise BuildError(f"{params['name']}: the binary says soc_type={target.get('soc_type')} "
                         f"arch={target.get('arch')}, expected {chip['name']} {chip['dsp_arch']}")
    return {"bytes": binary.stat().st_size, "target": target}

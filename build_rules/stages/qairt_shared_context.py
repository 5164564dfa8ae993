"""Stage shared_context (qairt, DLC flow, [model] share_weights): the group's DLCs compiled into one context binary
that stores their shared weights once -> out/<model>/<variant>/<chip>/shared/<g1>+<g2>.bin, <group>.info.json (its
graphs and I/O, from qnn-context-binary-utility) and <group>.json (the report `doit dist` reads, as ort-qnn's, with
the HTP config the generator read: it is written beside the binary for the run only, since it names its own path).

qnn-context-binary-generator takes the DLCs as one comma-separated --dlc_path; the chip's HTP config names every
graph under graph_names and sets "context": {"weight_sharing_enabled": true} (docs/qairt.md). The binary is not run
here: each graph was checked as compiled apart.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import BuildError
from ..plumbing.files import atomic_write_json, atomic_write_text
from ..toolchains.sdk_tool import run_tool, short, tail


def run(params: dict) -> dict:
    from .. import dist
    from ..toolchains import qairt
    from ..toolchains.qnn_binary import read_binary_target
    from ..toolchains.qairt_outputs import ContractError, binary_graph_names, read_io_contract

    import onnx

    from ..toolchains.ort_qnn_shared import align_weights
    _, shared, shared_bytes = align_weights({g: onnx.load(f["onnx"]) for g, f in params["graphs"].items()})
    if not shared:  # the float graphs tell; the DLCs are the SDK's format
        raise BuildError(f"{params['name']}: graphs {', '.join(params['graphs'])} share no weights (no initializer "
                         "with the same value in their float ONNX graphs); take them out of [model] share_weights")
    sdk = qairt.Sdk(Path(params["sdk"]))
    report_path = Path(params["outputs"]["report"])
    folder = report_path.parent
    folder.mkdir(parents=True, exist_ok=True)
    names = [qairt.qnn_graph_name(g) for g in params["graphs"]]
    config_path = folder / f"{params['group']}.htp_config.json"
    extensions_path = folder / f"{params['group']}.htp_backend_extensions.json"
    extensions, config = qairt.shared_htp_config_files(sdk, names, params["chip"], str(config_path.absolute()))
    atomic_write_text(config_path, json.dumps(config, indent=4) + "\n")
    atomic_write_text(extensions_path, json.dumps(extensions, indent=4) + "\n")
    binary = Path(params["outputs"]["binary"])
    dlcs = [files["dlc"] for files in params["graphs"].values()]  # in the group's order
    cmd = qairt.context_binary_command(sdk, short(folder), binary.stem, short(extensions_path), dlc=dlcs)
    code, text = run_tool(cmd, sdk)
    if code != 0 or not binary.is_file():
        raise BuildError(f"{params['name']}: qnn-context-binary-generator could not make one context of "
                         f"{', '.join(params['graphs'])} (exit code {code}):\n{tail(text)}")
    info = Path(params["outputs"]["info"])
    code, text = run_tool(qairt.binary_info_command(sdk, short(binary), short(info)), sdk)
    if code != 0 or not info.is_file():
        raise BuildError(f"{params['name']}: qnn-context-binary-utility could not read {binary.name}:\n{tail(text)}")
    try:
        found = binary_graph_names(info)
        if sorted(found) != sorted(names):
            raise BuildError(f"{params['name']}: {binary.name} holds graph(s) {found}, expected {names}")
        graphs = {g: {"qnn_graph": n, "io": read_io_contract(info, n),
                      "apart_bytes": Path(params["graphs"][g]["apart_binary"]).stat().st_size}
                  for g, n in zip(params["graphs"], names)}
    except ContractError as e:
        raise BuildError(f"{params['name']}: {e}") from None
    try:
        target = read_binary_target(binary)
    except ValueError:
        target = None
    report = {"group": list(params["graphs"]), "binary": binary.name, "bytes": binary.stat().st_size,
              "apart_bytes": sum(g["apart_bytes"] for g in graphs.values()), "sha256": dist.sha256(binary),
              "target": target, "shared_weights": {"count": len(shared), "bytes": shared_bytes, "names": shared[:50]}, "graphs": graphs,
              "emulator": {"loaded": False, "error": "not run: each graph was checked as compiled apart"},
              "checked": "each graph's own binary (compiled apart): the check tasks", "htp_config": config}
    atomic_write_json(report_path, report)
    return {"bytes": report["bytes"], "apart_bytes": report["apart_bytes"]}

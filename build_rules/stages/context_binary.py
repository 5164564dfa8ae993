"""Stage 6 (qairt), compile: x86_64 model lib + the chip's HTP config -> <chip>/<graph>.bin
(qnn-context-binary-generator on the x86 libQnnHtp.so backend, the binary a phone loads).
"""
from __future__ import annotations

from pathlib import Path

from ..errors import BuildError
from .sdk_tool import run_tool, short, tail

VERSION = 1


def run(params: dict) -> dict:
    from ..toolchains import ort_qnn, qairt

    sdk = qairt.Sdk(Path(params["sdk"]))
    binary = Path(params["outputs"]["binary"])
    binary.parent.mkdir(parents=True, exist_ok=True)
    cmd = qairt.context_binary_command(sdk, params["model_lib"], short(binary.parent), binary.stem,
                                       params["config_file"])
    code, text = run_tool(cmd)
    if code != 0:
        raise BuildError(f"{params['name']}: qnn-context-binary-generator failed with exit code {code}:\n"
                         f"{tail(text)}")
    if not binary.is_file():
        raise BuildError(f"{params['name']}: qnn-context-binary-generator exited 0 but wrote no {binary.name}")
    chip = params["chip"]
    try:
        target = ort_qnn.read_binary_target(binary)  # the HTP config string a context binary embeds
    except ValueError:
        print(f"note: {binary.name} has no readable embedded HTP config; chip and arch not verified", flush=True)
        return {"bytes": binary.stat().st_size, "target": None}
    if target.get("soc_type") != chip["name"] or str(target.get("arch")) != chip["dsp_arch"][1:]:
        raise BuildError(f"{params['name']}: the binary says soc_type={target.get('soc_type')} "
                         f"arch={target.get('arch')}, expected {chip['name']} {chip['dsp_arch']}")
    return {"bytes": binary.stat().st_size, "target": target}

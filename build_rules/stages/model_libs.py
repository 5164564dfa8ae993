"""Stage 5 (qairt), model libs: <graph>.cpp + .bin -> model_libs/<target>/lib<graph>.so (qnn-model-lib-generator).

Without -t the generator builds every default target: x86_64-linux-clang (used on the host to make context
binaries; needs clang++ and make, checked when doit loads) and aarch64-android (packaged for phones; needs ndk-build
on PATH). Without an NDK the task asks for -t x86_64-linux-clang only, and says so. LDFLAGS gives the libraries
16 KB page alignment (Android 15+).
"""
from __future__ import annotations

from pathlib import Path

from ..errors import BuildError
from ..toolchains.sdk_tool import run_tool, short, tail


def run(params: dict) -> dict:
    from ..toolchains import qairt

    sdk = qairt.Sdk(Path(params["sdk"]))
    outputs = params["outputs"]
    out_dir = Path(outputs[qairt.HOST]).parent.parent  # model_libs/, shared by the variant's graphs
    out_dir.mkdir(parents=True, exist_ok=True)
    if params["lib_targets"]:
        print(f"warning: no ndk-build on PATH: building {', '.join(params['lib_targets'])} only, no "
              f"{qairt.DEVICE} model lib", flush=True)
    cmd = qairt.model_lib_command(sdk, params["cpp"], params["bin"], short(out_dir), params["lib_targets"])
    code, text = run_tool(cmd, sdk, extra_env={"LDFLAGS": qairt.LDFLAGS})
    if code != 0:
        raise BuildError(f"{params['name']}: qnn-model-lib-generator failed with exit code {code}:\n{tail(text)}")
    missing = [path for path in outputs.values() if not Path(path).is_file()]
    if missing:
        found = sorted(str(p.relative_to(out_dir)) for p in out_dir.rglob("*.so"))
        raise BuildError(f"{params['name']}: qnn-model-lib-generator did not write "
                         f"{', '.join(str(Path(p).relative_to(out_dir)) for p in missing)} (it wrote: "
                         f"{', '.join(found) or 'nothing'})")
    return {"targets": sorted(outputs)}

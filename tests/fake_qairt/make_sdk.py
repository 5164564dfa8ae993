"""Lays out a stand-in QAIRT SDK tree (Linux x86_64) in a folder, for tests of the qairt toolchain.

    make_sdk(tmp_path / "qairt" / "2.40.0.251030") -> Path   # use as $QNN_SDK_ROOT
    make_host_tools(tmp_path / "host-bin") -> Path            # stand-in clang++ and make, to put on PATH

It has a real-format sdk.yaml (`version: 2.40.0`, `build_id: 251030`), the command-line tools the build runs
(bin/x86_64-linux-clang/qnn-onnx-converter, qnn-model-lib-generator, qnn-context-binary-generator,
qnn-context-binary-utility, with net_run=True qnn-net-run, and from QAIRT 2.21 on the DLC flow's qairt-converter
and qairt-quantizer with lib/x86_64-linux-clang/libQnnModelDlc.so), lib/python/qti/aisw (what the converters
import) and placeholder libraries where the real SDK keeps its libraries (lib/x86_64-linux-clang,
lib/aarch64-android, lib/hexagon-v<arch>/unsigned). The tools are Python scripts (tools.py) that refuse to run
without the environment the real ones need, parse their arguments with exactly the real tools' flags (a subset;
an unknown or missing flag fails), append their command line as a JSON line to $FAKE_QAIRT_LOG and write
recognisable outputs in the real formats where the build reads them (_net.json, qnn-context-binary-utility JSON).
The placeholder libQnnHtp.so is not a shared library, so the toolchain's build-id probe fails on it and falls back
to the library's digest.
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOOLS = ("qnn-onnx-converter", "qnn-model-lib-generator", "qnn-context-binary-generator", "qnn-context-binary-utility")
DLC_TOOLS = ("qairt-converter", "qairt-quantizer")
DLC_SINCE = (2, 21)  # qairt-converter's first (beta) release
ARCHS = ("v68", "v69", "v73", "v75", "v79", "v81")


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".")[:3])


def make_sdk(root: Path, version: str = "2.40.0.251030", net_run: bool = False) -> Path:
    root = Path(root)
    release, _, build_id = version.rpartition(".")
    dlc = version_tuple(version) >= DLC_SINCE
    (root / "bin" / "x86_64-linux-clang").mkdir(parents=True, exist_ok=True)
    (root / "sdk.yaml").write_text(f"name: qairt\nversion: {release}\nbuild_id: {build_id}\n"
                                   "description: stand-in Qualcomm AI Runtime SDK for tests\n")
    for tool in TOOLS + (DLC_TOOLS if dlc else ()) + (("qnn-net-run",) if net_run else ()):
        script = root / "bin" / "x86_64-linux-clang" / tool
        script.write_text(f"#!{sys.executable}\n# stand-in for the QAIRT tool {tool}\n"
                          f"import sys\nsys.path.insert(0, {str(HERE)!r})\n"
                          f"import tools\nsys.exit(tools.main({tool!r}, sys.argv[1:], __file__))\n")
        script.chmod(0o755)
    package = root / "lib" / "python" / "qti" / "aisw"
    package.mkdir(parents=True, exist_ok=True)
    (package.parent / "__init__.py").write_text("")
    (package / "__init__.py").write_text(f"STAND_IN_VERSION = {version!r}\n")
    libs = ["lib/x86_64-linux-clang/libQnnHtp.so", "lib/x86_64-linux-clang/libQnnHtpNetRunExtensions.so",
            "lib/x86_64-linux-clang/libQnnHtpPrepare.so", "lib/x86_64-linux-clang/libQnnSystem.so",
            "lib/aarch64-android/libQnnHtp.so", "lib/aarch64-android/libQnnSystem.so",
            "lib/aarch64-android/libQnnHtpPrepare.so"]
    libs += ["lib/x86_64-linux-clang/libQnnModelDlc.so", "lib/aarch64-android/libQnnModelDlc.so"] if dlc else []
    for arch in ARCHS:
        libs += [f"lib/aarch64-android/libQnnHtp{arch.upper()}Stub.so",
                 f"lib/hexagon-{arch}/unsigned/libQnnHtp{arch.upper()}Skel.so"]
    for lib in libs:
        path = root / lib
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"stand-in {lib} of QAIRT {version} (a placeholder, not a shared library)\n")
    return root


def make_host_tools(folder: Path, programs=("clang++", "make")) -> Path:
    """Stand-ins for the host programs qnn-model-lib-generator runs (this machine may have neither)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for program in programs:
        path = folder / program
        path.write_text(f"#!/bin/sh\n# stand-in {program}\nexit 0\n")
        path.chmod(0o755)
    return folder


if __name__ == "__main__":
    print(make_sdk(Path(sys.argv[1]), *sys.argv[2:3]))

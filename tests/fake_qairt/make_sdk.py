"""Lays out a stand-in QAIRT SDK tree (Linux x86_64) in a folder, for tests of the qairt toolchain.

    make_sdk(tmp_path / "qairt" / "2.40.0.251030") -> Path   # use as $QNN_SDK_ROOT

It has sdk.yaml, the command-line tools the build runs (bin/x86_64-linux-clang/qnn-onnx-converter,
qnn-model-lib-generator, qnn-context-binary-generator and, with net_run=True, qnn-net-run) and placeholder
libraries where the real SDK keeps its libraries (lib/x86_64-linux-clang, lib/aarch64-android,
lib/hexagon-v<arch>/unsigned). The tools are Python scripts (tools.py) that parse their arguments with exactly
the real tools' flags (a subset of them; an unknown or missing flag fails), append their command line as a JSON
line to $FAKE_QAIRT_LOG and write recognisable outputs. The placeholder libQnnHtp.so is not a shared library,
so the toolchain's build-id probe fails on it and falls back to the library's digest.
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOOLS = ("qnn-onnx-converter", "qnn-model-lib-generator", "qnn-context-binary-generator")
ARCHS = ("v68", "v69", "v73", "v75", "v79", "v81")


def make_sdk(root: Path, version: str = "2.40.0.251030", net_run: bool = False) -> Path:
    root = Path(root)
    (root / "bin" / "x86_64-linux-clang").mkdir(parents=True, exist_ok=True)
    (root / "sdk.yaml").write_text(f"name: qairt\nversion: {version}\n")
    for tool in TOOLS + (("qnn-net-run",) if net_run else ()):
        script = root / "bin" / "x86_64-linux-clang" / tool
        script.write_text(f"#!{sys.executable}\n# stand-in for the QAIRT tool {tool}\n"
                          f"import sys\nsys.path.insert(0, {str(HERE)!r})\n"
                          f"import tools\nsys.exit(tools.main({tool!r}, sys.argv[1:]))\n")
        script.chmod(0o755)
    libs = ["lib/x86_64-linux-clang/libQnnHtp.so", "lib/x86_64-linux-clang/libQnnHtpNetRunExtensions.so",
            "lib/x86_64-linux-clang/libQnnSystem.so", "lib/aarch64-android/libQnnHtp.so",
            "lib/aarch64-android/libQnnSystem.so", "lib/aarch64-android/libQnnHtpPrepare.so"]
    for arch in ARCHS:
        libs += [f"lib/aarch64-android/libQnnHtp{arch.upper()}Stub.so",
                 f"lib/hexagon-{arch}/unsigned/libQnnHtp{arch.upper()}Skel.so"]
    for lib in libs:
        path = root / lib
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"stand-in {lib} of QAIRT {version} (a placeholder, not a shared library)\n")
    return root


if __name__ == "__main__":
    print(make_sdk(Path(sys.argv[1]), *sys.argv[2:3]))

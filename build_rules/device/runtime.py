"""The QNN runtime for Android a device task pushes: from a QAIRT SDK (QNN_SDK_ROOT) or a folder with the same
layout (BUILD_RULES_QNN_RUNTIME, e.g. the SDK's lib/ and bin/ copied out). onnxruntime-qnn's wheel has no Android
libraries, so without one of these a device task fails before it touches the phone.

What is pushed for a chip of Hexagon arch vNN (seed guide step 4; QNN docs "Backend" table):
  lib/aarch64-android/libQnnHtp.so, libQnnHtpVNNStub.so, libQnnSystem.so (reads the context binary),
  lib/hexagon-vNN/unsigned/libQnnHtpVNNSkel.so (runs on the DSP: its folder goes in ADSP_LIBRARY_PATH),
  bin/aarch64-android/qnn-net-run.
libQnnHtpPrepare.so (~85 MB, on-device graph prepare) is not pushed: a context binary needs no prepare.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from .errors import DeviceError

ENV = "BUILD_RULES_QNN_RUNTIME"


def folder(where: str) -> Path:
    """The runtime folder, or a DeviceError saying what to set (raised before anything talks to the phone)."""
    value = os.environ.get(ENV) or os.environ.get("QNN_SDK_ROOT")
    if not value:
        raise DeviceError(f"{where}: no QNN runtime for the phone: set QNN_SDK_ROOT to an unpacked QAIRT SDK (e.g. "
                          f"qairt/2.40.0.251030), or {ENV} to a folder with its lib/aarch64-android, "
                          "lib/hexagon-v<arch>/unsigned and bin/aarch64-android; onnxruntime-qnn's wheel has no "
                          "Android libraries. Use the QAIRT version the binaries were compiled with (or newer)")
    path = Path(value)
    if not path.is_dir():
        raise DeviceError(f"{where}: {ENV if os.environ.get(ENV) else 'QNN_SDK_ROOT'}={value}: no such folder")
    return path


def files(root: Path, arch: str, where: str, cpu: bool = False) -> dict[str, Path]:
    """name on the phone -> local file, for a chip of Hexagon arch 'v79'; every missing file named at once."""
    number = arch.upper()  # V79
    wanted = {"libQnnHtp.so": root / "lib" / "aarch64-android" / "libQnnHtp.so",
              f"libQnnHtp{number}Stub.so": root / "lib" / "aarch64-android" / f"libQnnHtp{number}Stub.so",
              "libQnnSystem.so": root / "lib" / "aarch64-android" / "libQnnSystem.so",
              f"libQnnHtp{number}Skel.so": root / "lib" / f"hexagon-{arch}" / "unsigned" / f"libQnnHtp{number}Skel.so",
              "qnn-net-run": root / "bin" / "aarch64-android" / "qnn-net-run"}
    if cpu:
        wanted["libQnnCpu.so"] = root / "lib" / "aarch64-android" / "libQnnCpu.so"
    missing = [str(p.relative_to(root)) for p in wanted.values() if not p.is_file()]
    if missing:
        raise DeviceError(f"{where}: the QNN runtime at {root} lacks {', '.join(missing)} (a QAIRT SDK has them; the "
                          f"chip's Hexagon arch is {arch})")
    return wanted


def profile_viewer(root: Path, where: str) -> Path:
    path = root / "bin" / "x86_64-linux-clang" / "qnn-profile-viewer"
    if not path.is_file():
        raise DeviceError(f"{where}: {path} is missing: the profile is read back with the SDK's qnn-profile-viewer")
    return path


def identity(root: Path, pushed: dict[str, str]) -> dict:
    """The runtime's version (sdk.yaml: `version: X.Y.Z`, `build_id: N`) and the digests of what is pushed."""
    version = build_id = None
    yaml = root / "sdk.yaml"
    if yaml.is_file():
        text = yaml.read_text(errors="replace")
        found = re.search(r"^version:\s*(\S+)", text, re.M)
        version = found.group(1) if found else None
        found = re.search(r"^build_id:\s*(\S+)", text, re.M)
        build_id = found.group(1) if found else None
    return {"root": str(root), "version": version, "build_id": build_id, "files": dict(sorted(pushed.items()))}

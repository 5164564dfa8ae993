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


def release(root: Path) -> tuple[str | None, str | None, str]:
    """(version, build id, where they came from) of the runtime folder: sdk.yaml (`version: 2.40.0`, `build_id:
    251030`), else a folder named like a QAIRT download (2.40.0.251030), as the qairt toolchain reads its SDK."""
    from ..toolchains.qairt import SdkError, Sdk
    try:
        return Sdk(root).release()
    except SdkError:
        return None, None, "sdk.yaml (unreadable)"


def identity(root: Path, pushed: dict[str, str]) -> dict:
    """The runtime's version and build id (release()) and the digests of what is pushed."""
    version, build_id, _ = release(root)
    return {"root": str(root), "version": version, "build_id": build_id, "files": dict(sorted(pushed.items()))}


def _numbers(version: str | None) -> tuple[int, ...] | None:
    found = re.match(r"v?(\d+)\.(\d+)\.(\d+)", version or "")
    return tuple(int(n) for n in found.groups()) if found else None


def built_with(toolchain: dict) -> tuple[str, str]:
    """(QNN version, what made them) of the binaries a toolchain identity (project.toolchain) compiles."""
    if toolchain["name"] == "qairt":
        from ..toolchains.qairt import release_name
        return toolchain["sdk_version"], f"the qairt toolchain, QAIRT {release_name(toolchain)}"
    return toolchain["qnn_version"], (f"onnxruntime-qnn {toolchain.get('package_version')} (QNN "
                                      f"{toolchain['qnn_version']}, build {toolchain.get('build_id')})")


def check_loads(where: str, root: Path, toolchain: dict) -> None:
    """Refuse, before anything talks to the phone, a runtime older than the SDK that compiled the binaries: QNN
    context binaries load on the runtime of their own SDK or a newer one only (the HTP backend refuses a newer blob:
    "Using newer context binary on old SDK", QNN_CONTEXT_ERROR_BINARY_VERSION)."""
    binary, made_by = built_with(toolchain)
    version, _, source = release(root)
    setting = ENV if os.environ.get(ENV) else "QNN_SDK_ROOT"
    if _numbers(version) is None:
        raise DeviceError(f"{where}: cannot tell the version of the QNN runtime at {root} ({setting}): no sdk.yaml with "
                          "`version: X.Y.Z` and the folder is not named like a QAIRT release (2.51.0.260929); copy "
                          f"the SDK's sdk.yaml into it. The binaries need QNN {binary} or newer ({made_by})")
    if _numbers(version) < _numbers(binary):
        raise DeviceError(f"{where}: the QNN runtime for the phone is QAIRT {version} ({setting}={root}, {source}), older "
                          f"than the binaries' QNN {binary} ({made_by}): a phone refuses a context binary from a newer "
                          f"SDK (\"Using newer context binary on old SDK\"). Use a QAIRT SDK {binary} or newer for the "
                          f"phone ({setting}), or build the binaries with the phone's SDK (toolchain = \"qairt\" in "
                          "chips.toml, QNN_SDK_ROOT at that SDK)")

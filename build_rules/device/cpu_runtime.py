"""The CPU baseline's runtime for the phone (seed guide step 0; issue 29 items 3 and 4): ONNX Runtime's CPU
execution provider on the phone's CPU, running the float ONNX graph, through ort-cpu-run (ort_cpu_run.c).

What is installable here that runs an ONNX graph on an Android aarch64 CPU (docs/device.md, "CPU baseline", says
what was searched): PyPI's onnxruntime wheel for manylinux_2_28_aarch64 carries libonnxruntime.so.1.<x> (glibc);
Debian's cross packages carry an aarch64 glibc (gcc-aarch64-linux-gnu, libc6-arm64-cross,
libstdc++6-arm64-cross). Android's own loader cannot load glibc programs, so the folder holds glibc's loader too,
and the phone runs `<dir>/ld-linux-aarch64.so.1 --library-path <dir> <dir>/ort-cpu-run ...` (an explicit loader
call: no /lib, /etc/ld.so.cache or root needed). The Android builds of ONNX Runtime (Maven's onnxruntime-android)
are not reachable from here.

`python -m build_rules.device cpu-runtime DIR` makes the folder: ort-cpu-run compiled with aarch64-linux-gnu-gcc
against the wheel's library, the library as libonnxruntime.so.1 (its soname), and the glibc files it needs.
BUILD_RULES_CPU_RUNTIME=DIR makes profile and power use it. Standard library only.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .errors import DeviceError

ENV = "BUILD_RULES_CPU_RUNTIME"
LOADER = "ld-linux-aarch64.so.1"
RUNNER = "ort-cpu-run"
LIBRARY = "libonnxruntime.so.1"
# what libonnxruntime.so.1 (PyPI, manylinux_2_28_aarch64) and ort-cpu-run need besides each other (readelf -d)
GLIBC = ("libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0", "libgcc_s.so.1", "libstdc++.so.6")
FILES = (LOADER, RUNNER, LIBRARY, *GLIBC)
CROSS_LIBS = Path("/usr/aarch64-linux-gnu/lib")
SOURCE = Path(__file__).with_name("ort_cpu_run.c")


def folder() -> Path | None:
    """The CPU runtime folder, or None when BUILD_RULES_CPU_RUNTIME is unset (then the CPU baseline is not measured,
    and the result says why)."""
    value = os.environ.get(ENV)
    return Path(value) if value else None


def files(root: Path, where: str) -> dict[str, Path]:
    """name on the phone -> local file; every missing one named at once, with the command that makes them."""
    wanted = {name: root / name for name in FILES}
    missing = [name for name, path in wanted.items() if not path.is_file()]
    if missing:
        raise DeviceError(f"{where}: {ENV}={root} lacks {', '.join(missing)}: make the folder with "
                          f"`python -m build_rules.device cpu-runtime {root}`")
    return wanted


NOT_SET = (f"not measured: set {ENV} to a folder made by `python -m build_rules.device cpu-runtime DIR` (ONNX "
           "Runtime's CPU execution provider from PyPI's aarch64 wheel, run on the phone through a pushed glibc "
           "loader; docs/device.md)")


def build(root: Path, wheel: Path | None = None) -> Path:
    """Make the folder: compile ort-cpu-run for aarch64 (glibc) against the wheel's libonnxruntime, copy the glibc
    files beside it. wheel: an onnxruntime manylinux aarch64 wheel (default: pip download of the host's version)."""
    compiler = shutil.which("aarch64-linux-gnu-gcc")
    missing = [name for name in (LOADER, *GLIBC) if not (CROSS_LIBS / name).exists()]
    if compiler is None or missing:
        raise DeviceError("the CPU runtime is built with Debian's aarch64 cross toolchain: `apt-get install "
                          "gcc-aarch64-linux-gnu libstdc++6-arm64-cross` (missing: "
                          f"{'aarch64-linux-gnu-gcc' if compiler is None else ', '.join(missing)})")
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="build-rules-cpu-runtime-") as tmp:
        wheel = wheel or _download_wheel(Path(tmp))
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if Path(n).name.startswith("libonnxruntime.so.1.")]
            if not names:
                raise DeviceError(f"{wheel} holds no onnxruntime/capi/libonnxruntime.so.1.<x> (an onnxruntime wheel "
                                  "for manylinux aarch64 has it)")
            (root / LIBRARY).write_bytes(z.read(names[0]))
        done = subprocess.run([compiler, "-O2", "-Wall", "-o", str(root / RUNNER), str(SOURCE), str(root / LIBRARY)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise DeviceError(f"aarch64-linux-gnu-gcc failed on {SOURCE}:\n{done.stderr[-2000:]}")
    for name in (LOADER, *GLIBC):
        shutil.copyfile(CROSS_LIBS / name, root / name)  # the files, not the links (adb push would copy links)
    for name in (LOADER, RUNNER):
        (root / name).chmod(0o755)
    return root


def _download_wheel(folder: Path) -> Path:
    from importlib.metadata import PackageNotFoundError, version
    try:
        pinned = f"onnxruntime=={version('onnxruntime')}"
    except PackageNotFoundError:
        pinned = "onnxruntime"
    done = subprocess.run([sys.executable, "-m", "pip", "download", pinned, "--platform", "manylinux_2_28_aarch64",
                           "--python-version", f"{sys.version_info.major}{sys.version_info.minor}",
                           "--only-binary=:all:", "--no-deps", "-d", str(folder)], capture_output=True, text=True)
    found = sorted(folder.glob("onnxruntime-*aarch64*.whl"))
    if done.returncode != 0 or not found:
        raise DeviceError(f"pip download {pinned} (manylinux_2_28_aarch64) failed: "
                          f"{(done.stderr or done.stdout).strip()[-800:]}")
    return found[0]

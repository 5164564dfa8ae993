"""Stand-in phones for tests of the device tasks: a fake `adb` and, per phone, a folder.

    make_adb(bin_dir) -> Path                      # an `adb` script; put bin_dir first on PATH
    make_phone(phones, serial, soc=..., arch=..., host_repo=...) -> Path   # phones/<serial>/ (phone.json, fs/)
    make_runtime(root) -> Path                     # a QAIRT-layout runtime folder (BUILD_RULES_QNN_RUNTIME)
    make_cpu_runtime(root) -> Path                 # the CPU baseline's folder (BUILD_RULES_CPU_RUNTIME)

The fake adb (adb.py) answers devices [-l], -s SERIAL shell/push/pull with the real adb's output formats and exit
codes; its shell runs a small sh (adb.py: cd, export, &&, ;, &, redirections, getprop, sha256sum, cat, mkdir,
rm, chmod, kill, getconf, dumpsys battery and thermalservice, /system/bin/time -v) over the phone's folder fs/ (the phone's /), with /proc from the host
(a background process's /proc/<pid>/stat is the real one) and /sys/class/power_supply/battery simulated from
phone.json's battery (a constant drain); `dumpsys thermalservice` shows phone.json's
thermal {"status": N, "temperatures": {name: [type, celsius]}} (tests set it with set_phone);
`/system/bin/time -v` prints toybox's "Max RSS (KiB)" of the program it ran, measured on the host. Set FAKE_ADB_PHONES to the phones folder and FAKE_ADB_LOG to a file
for a JSON line per adb call. phone.json "unplug_when": a substring of an adb command line at which the phone is
gone (it and every later call get "adb: device '<serial>' not found", exit 1); "hang_when": a substring at which
adb waits without end (a phone that stopped answering).
The runtime's bin/aarch64-android/qnn-net-run is net_run.py: it refuses to run off the phone, checks its flags and
its environment (LD_LIBRARY_PATH, ADSP_LIBRARY_PATH, the chip's Stub/Skel) and runs the context binary on the x86
HTP emulator (onnxruntime-qnn), so the numbers a device check judges are real HTP numerics.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def _script(path: Path, module: str, call: str, stdlib_only: bool = False) -> Path:
    """An executable that runs module.call(argv). stdlib_only: python -S, without site's .pth files (~35 ms of the
    ~75 ms an `adb` call took here; a test run makes ~500 of them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    python = f"{sys.executable} -S" if stdlib_only else sys.executable
    path.write_text(f"#!{python}\nimport sys\nsys.path.insert(0, {str(HERE)!r})\n"
                    f"import {module}\nsys.exit({module}.{call}(sys.argv[1:]))\n")
    path.chmod(0o755)
    return path


def make_adb(bin_dir: Path) -> Path:
    return _script(Path(bin_dir) / "adb", "adb", "main", stdlib_only=True)


def make_phone(phones: Path, serial: str, *, soc: str = "SM8750", arch: str = "v79", host_repo: Path,
               product: str = "SM-S931B", fingerprint: str | None = None, state: str = "device",
               charge_counter_uah: int = 3_000_000, drain_uah_per_s: float = 150.0) -> Path:
    folder = Path(phones) / serial
    (folder / "fs" / "data" / "local" / "tmp").mkdir(parents=True, exist_ok=True)
    fingerprint = fingerprint or "samsung/pa1qxxx/pa1q:15/AP3A.240905.015.A2/S931BXXU1AYA1:user/release-keys"
    (folder / "phone.json").write_text(json.dumps({
        "serial": serial, "state": state, "arch": arch, "host_repo": str(host_repo),
        "props": {"ro.soc.model": soc, "ro.product.model": product, "ro.build.fingerprint": fingerprint,
                  "ro.product.name": "pa1qxxx", "ro.product.device": "pa1q"},
        "battery": {"level": 80, "charge_counter_uah": charge_counter_uah, "drain_uah_per_s": drain_uah_per_s,
                    "full_uah": 3_750_000},
        "thermal": {"status": 0, "temperatures": {"cpu-0-0": [0, 38.5], "skin": [3, 31.0], "battery": [2, 29.0]}},
        "unplug_when": None, "hang_when": None}, indent=2))
    return folder


def make_runtime(root: Path, version: str = "2.40.0.251030") -> Path:
    sys.path.insert(0, str(HERE.parent))
    from fake_qairt.make_sdk import make_sdk
    root = make_sdk(Path(root), version)
    _script(root / "bin" / "aarch64-android" / "qnn-net-run", "net_run", "main")
    _script(root / "bin" / "x86_64-linux-clang" / "qnn-profile-viewer", "profile_viewer", "main",
            stdlib_only=True)
    (root / "lib" / "aarch64-android" / "libQnnCpu.so").write_bytes(b"stand-in libQnnCpu.so\n")
    (root / "lib" / "aarch64-android" / "libQnnHtpNetRunExtensions.so").write_bytes(
        b"stand-in libQnnHtpNetRunExtensions.so\n")
    return root


def set_phone(folder: Path, **changes) -> None:
    data = json.loads((Path(folder) / "phone.json").read_text())
    for key, value in changes.items():
        if key in data["props"]:
            data["props"][key] = value
        else:
            data[key] = value
    (Path(folder) / "phone.json").write_text(json.dumps(data, indent=2))


def make_cpu_runtime(root: Path) -> Path:
    """The CPU runtime folder with cpu_runtime.FILES: ort-cpu-run is the real ort_cpu_run.c built for this x86-64 host
    (cc) against the host's libonnxruntime (the onnxruntime package's); the loader is cpu_loader.py (it runs that
    build with the host library); the libraries the real loader would load are placeholders of the same names."""
    import subprocess

    import onnxruntime
    sys.path.insert(0, str(ROOT))
    from build_rules.device import cpu_runtime
    root = Path(root)
    host_lib = root.parent / f"{root.name}.host-lib"  # beside the folder: not pushed
    host_lib.mkdir(parents=True, exist_ok=True)
    capi = Path(onnxruntime.__file__).parent / "capi"
    library = next(capi.glob("libonnxruntime.so.1.*"))
    (host_lib / "libonnxruntime.so.1").unlink(missing_ok=True)
    (host_lib / "libonnxruntime.so.1").symlink_to(library)
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cc", "-O2", "-Wall", "-o", str(root / cpu_runtime.RUNNER), str(cpu_runtime.SOURCE),
                    str(library)], check=True)
    loader = root / cpu_runtime.LOADER
    loader.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(HERE)!r})\nimport cpu_loader\n"
                      f"cpu_loader.HOST_LIBRARY_DIR = {str(host_lib)!r}\nsys.exit(cpu_loader.main(sys.argv[1:]))\n")
    loader.chmod(0o755)
    for name in (cpu_runtime.LIBRARY, *cpu_runtime.GLIBC):
        (root / name).write_bytes(f"stand-in {name} (the x86 runner uses the host's)\n".encode())
    return root

"""What every device task does first, before anything runs on the phone: the runtime (or fail saying what to set;
one older than the SDK that compiled the binaries is refused), the phone plugged in and ready, its SoC the chip the
binaries were compiled for, and what the phone is (model, build fingerprint) for the result's key and record. Then
the pushes and the qnn-net-run command line."""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from . import runtime
from .adb import Adb
from .devices import REMOTE_ROOT
from .errors import DeviceError
from .push import push_missing

# ADSP_LIBRARY_PATH: the Skel's folder first, then the system's DSP library folders (QNN/SNPE docs: ';'-separated,
# quoted, never the file itself)
SYSTEM_DSP_PATHS = "/vendor/lib/rfsa/adsp;/vendor/dsp/cdsp;/system/lib/rfsa/adsp;/system/vendor/lib/rfsa/adsp;/dsp"
REMOTE_RUNTIME = f"{REMOTE_ROOT}/runtime"


@dataclass
class Phone:
    adb: Adb
    soc: str
    product: str
    fingerprint: str
    runtime_root: Path
    runtime_files: dict[str, Path]


def open_phone(params: dict, cpu: bool = False) -> Phone:
    where = params["name"]
    device, chip = params["device"], params["chip"]
    root = runtime.folder(where)  # no SDK: fail here, before adb is called at all
    files = runtime.files(root, chip["dsp_arch"], where, cpu=cpu)
    runtime.check_loads(where, root, params["toolchain"])  # a runtime older than the binaries: before any push
    phone = Adb(device["serial"], device["name"])
    phone.check_ready()
    soc = phone.getprop("ro.soc.model")
    if soc not in params["chips"]:
        raise DeviceError(f"{where}: phone {device['name']} ({device['serial']}) reports ro.soc.model '{soc}', which "
                          f"maps to no chip in chips.toml (chips: {', '.join(params['chips'])}): its binaries cannot "
                          "run there; fix devices.toml or add the chip")
    if soc != device["soc"] or soc != chip["name"]:
        raise DeviceError(f"{where}: phone {device['name']} ({device['serial']}) reports ro.soc.model '{soc}', but "
                          f"devices.toml names {device['soc']} and the binary is compiled for {chip['name']} "
                          f"({chip['dsp_arch']}): a context binary runs only on its own Hexagon arch; fix soc in "
                          "devices.toml (`python -m build_rules.device list`)")
    return Phone(adb=phone, soc=soc, product=phone.getprop("ro.product.model"),
                 fingerprint=phone.getprop("ro.build.fingerprint"), runtime_root=root, runtime_files=files)


def push_runtime_and(phone: Phone, more: dict[str, str | Path]) -> dict:
    files = {f"{REMOTE_RUNTIME}/{name}": path for name, path in phone.runtime_files.items()}
    files.update(more)
    return push_missing(phone.adb, files)


def runtime_identity(phone: Phone, pushed: dict) -> dict:
    digests = {remote.rsplit("/", 1)[1]: d for remote, d in pushed["digests"].items()
               if remote.startswith(REMOTE_RUNTIME + "/")}
    return runtime.identity(phone.runtime_root, digests)


def net_run(binary: str, input_list: str, output_dir: str, *extra: str, backend: str = "libQnnHtp.so",
            wrapper: str = "") -> str:
    """The remote command: qnn-net-run from the pushed runtime with LD_LIBRARY_PATH and ADSP_LIBRARY_PATH set
    (`wrapper`: a program that runs it, e.g. profile's `/system/bin/time -v` for its peak memory)."""
    args = ["--backend", f"{REMOTE_RUNTIME}/{backend}", "--retrieve_context", binary, "--input_list", input_list,
            "--output_dir", output_dir, *extra]
    return (f"rm -rf {shlex.quote(output_dir)} && cd {REMOTE_ROOT} && "
            f"export LD_LIBRARY_PATH={REMOTE_RUNTIME} && "
            f"export ADSP_LIBRARY_PATH={shlex.quote(REMOTE_RUNTIME + ';' + SYSTEM_DSP_PATHS)} && "
            f"{wrapper + ' ' if wrapper else ''}{REMOTE_RUNTIME}/qnn-net-run " + " ".join(shlex.quote(a) for a in args))


def missing_library_hint(output: str, phone: Phone) -> str:
    """qnn-net-run's raw `dlopen failed: library "X" not found`, explained: X is one of the runtime files pushed (then
    it is gone from the phone: push the runtime anew), or one the runtime folder lacks, or the phone's own."""
    found = re.search(r'dlopen failed: library "([^"]+)" not found', output)
    if not found:
        return ""
    library = found.group(1).rsplit("/", 1)[-1]
    clean = f"python -m build_rules.device clean {phone.adb.name}"
    if library in phone.runtime_files:
        return (f"\nhint: {library} is part of the QNN runtime this task pushes to {REMOTE_RUNTIME}/ (from "
                f"{phone.runtime_files[library]}), and qnn-net-run did not find it there on the phone: remove the "
                f"tool's files with `{clean}` and run the task again, which pushes the whole runtime anew")
    return (f"\nhint: {library} is not among the QNN runtime files this task pushes ({', '.join(phone.runtime_files)}"
            f", from {phone.runtime_root}): if the QAIRT SDK has it (lib/aarch64-android/), the runtime push should "
            "include it (report it); otherwise it is a library of the phone's own system that qnn-net-run could not "
            "load")

"""The phones a repo names (devices.toml), where their results live, and the listing of what is plugged in.

devices.toml, beside chips.toml (optional; no file: no device tasks):

    [devices.s25]
    serial = "R5CX1234ABC"        # `adb devices -l`, first column
    soc = "SM8750"                # ro.soc.model: must name a chip in chips.toml
    model = "SM-S931B"            # ro.product.model (shown in reports)

`python -m build_rules.device list` runs `adb devices -l`, reads ro.soc.model, ro.product.model and
ro.build.fingerprint of each phone and prints these tables to paste. Loading this module and the table is light
(TOML only): `doit list` never calls adb; only the device tasks' actions do.
"""
from __future__ import annotations

import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ..build_state import layout
from .errors import DeviceError

DEVICES_FILE = "devices.toml"
REMOTE_ROOT = "/data/local/tmp/build_rules"  # everything the tasks push lives under here
NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Device:
    name: str
    serial: str
    soc: str          # a chip of chips.toml (the phone's ro.soc.model)
    model: str = ""   # ro.product.model


FILE_PROBLEM = ""  # Devices.problems' key for a mistake of the whole file (every phone's tasks are left out)


@dataclass(frozen=True)
class Devices:
    """devices.toml read: the phones it names well, and one line per mistake (device name -> the line). A mistake
    leaves that phone's tasks out, not the build: a build that touches no phone never fails on devices.toml; asking
    for a task of that phone says the line (unknown_tasks.py), and `doit list` warns with it."""
    path: str
    exists: bool
    found: dict  # name -> Device
    problems: dict  # name (FILE_PROBLEM: the whole file) -> one line naming the file and key


def load_devices(path: Path, chips: dict) -> Devices:
    """[devices.<name>] tables of devices.toml; a missing key or a soc that maps to no chip in chips.toml is a line
    naming the file, the table and the key, and that phone only gets no tasks."""
    path = Path(path)
    if not path.is_file():
        return Devices(str(path), False, {}, {})
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        return Devices(str(path), True, {}, {FILE_PROBLEM: f"{path}: not valid TOML: {e}"})
    unknown = set(data) - {"devices"}
    if unknown:
        return Devices(str(path), True, {}, {FILE_PROBLEM: f"{path}: unknown top-level key(s) {sorted(unknown)}: "
                                                            "only [devices.<name>] tables go here"})
    found, problems = {}, {}
    for name, entry in (data.get("devices") or {}).items():
        try:
            found[name] = _device(path, name, entry, chips)
        except DeviceError as e:
            problems[name] = str(e)
    return Devices(str(path), True, found, problems)


def _device(path: Path, name: str, entry, chips: dict) -> Device:
    where = f"{path} [devices.{name}]"
    if not NAME.match(name):
        raise DeviceError(f"{where}: a device name is letters, digits, '_', '.', '-' (it is part of task names)")
    if not isinstance(entry, dict):
        raise DeviceError(f"{where}: expected a table with serial and soc")
    extra = set(entry) - {"serial", "soc", "model", "fingerprint"}
    if extra:
        raise DeviceError(f"{where}: unknown key(s) {sorted(extra)} (known: serial, soc, model, fingerprint)")
    for key, what in (("serial", "the first column of `adb devices -l`"), ("soc", "the phone's ro.soc.model")):
        if not isinstance(entry.get(key), str) or not entry[key]:
            raise DeviceError(f"{where}: no {key} (a string: {what}); `python -m build_rules.device list` prints the "
                              "table to paste")
    if entry["soc"] not in chips:
        raise DeviceError(f"{where}: soc = {entry['soc']!r} (the phone's ro.soc.model) maps to no chip in "
                          f"chips.toml (chips: {', '.join(chips)}); add [chips.{entry['soc']}] with its soc_id and "
                          "dsp_arch to chips.toml, or fix the soc")
    return Device(name=name, serial=entry["serial"], soc=entry["soc"], model=entry.get("model", ""))


def unknown_device(devices: Devices, name: str) -> str:
    """Why a device task of phone `name` does not exist: its devices.toml line, or how to name the phone."""
    if name in devices.problems:
        return devices.problems[name]
    if FILE_PROBLEM in devices.problems:
        return devices.problems[FILE_PROBLEM]
    table = (f'[devices.{name}]\nserial = "<adb devices -l, first column>"\nsoc = "<its ro.soc.model, a chip of '
             'chips.toml>"')
    how = (f"add a table to {DEVICES_FILE} beside chips.toml:\n{table}\n(`python -m build_rules.device list` prints "
           "one for every phone plugged in; docs/device.md)")
    if not devices.exists:
        return f"no {DEVICES_FILE} names {name} (there is no {DEVICES_FILE} beside chips.toml): {how}"
    named = ", ".join(devices.found) or "no phone"
    return f"{devices.path} names no phone {name} (it names {named}): {how}"


# --- where results live (beside the variant's outputs) ---------------------------------------------------------

def check_result(model: str, variant: str, chip: str, graph: str, device: str) -> str:
    return layout.chip_file(model, variant, chip, f"{graph}.device.{device}.json")


def profile_result(model: str, variant: str, chip: str, device: str) -> str:
    return layout.chip_file(model, variant, chip, f"profile.{device}.json")


def power_result(model: str, variant: str, chip: str, device: str) -> str:
    return layout.chip_file(model, variant, chip, f"power.{device}.json")


def check_results(chip_dir: str | Path, graph: str) -> dict[str, dict]:
    """device name -> the device check result of one graph in a variant's chip folder (for the report and dist)."""
    import json
    found = {}
    for path in sorted(Path(chip_dir).glob(f"{graph}.device.*.json")):
        try:
            found[path.name[len(graph) + len(".device."):-len(".json")]] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return found


# --- `python -m build_rules.device list` ---------------------------------------------------------------------

def soc_to_chip(soc_model: str, chips: dict) -> str | None:
    """ro.soc.model -> the chips.toml name (they are the same strings: SM8750 ...), or None."""
    return soc_model if soc_model in chips else None


def listing(chips: dict) -> tuple[str, list[str]]:
    """(the TOML to paste, problems): every phone `adb devices -l` lists, read with getprop."""
    from .adb import Adb, devices
    lines, problems = [], []
    for entry in devices():
        serial = entry["serial"]
        if entry["state"] != "device":
            problems.append(f"{serial}: state '{entry['state']}'" + (
                " (accept the USB debugging prompt on the phone)" if entry["state"] == "unauthorized" else ""))
            continue
        phone = Adb(serial)
        soc, product, fingerprint = (phone.getprop(p) for p in
                                     ("ro.soc.model", "ro.product.model", "ro.build.fingerprint"))
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", (product or serial)).lower()
        chip = soc_to_chip(soc, chips)
        if chip is None:
            problems.append(f"{serial} ({product}): ro.soc.model '{soc}' maps to no chip in chips.toml (chips: "
                            f"{', '.join(chips)}); it gets no device tasks until chips.toml has [chips.{soc}]")
            lines.append(f"# ro.soc.model {soc} is not in chips.toml")
        lines += [f"[devices.{name}]", f'serial = "{serial}"', f'soc = "{soc}"', f'model = "{product}"',
                  f'# ro.build.fingerprint: {fingerprint}', ""]
    return "\n".join(lines), problems


def clean(name: str, chips: dict) -> str:
    """Remove everything the device tasks put on a phone (REMOTE_ROOT: the runtime, binaries, inputs, outputs, the
    CPU runtime); `name` is a devices.toml name or an adb serial. Results on this machine stay."""
    from .adb import Adb, devices as plugged
    named = load_devices(Path(DEVICES_FILE), chips)
    if name in named.found:
        phone = Adb(named.found[name].serial, name)
    elif name in {d["serial"] for d in plugged()}:
        phone = Adb(name)
    else:
        raise DeviceError(named.problems.get(name) or f"{name}: neither a phone {DEVICES_FILE} names nor a serial "
                                                       "`adb devices -l` lists")
    phone.check_ready()
    phone.shell(f"rm -rf {REMOTE_ROOT}")
    return f"{phone.name} ({phone.serial}): removed {REMOTE_ROOT}/ (what the device tasks pushed and ran there)"


def main(argv: list[str] | None = None) -> int:
    import argparse
    parser = argparse.ArgumentParser(prog="python -m build_rules.device",
                                     description="Phones over adb: `list` prints a [devices.<name>] table per phone "
                                                 "plugged in, to paste into devices.toml; `clean PHONE` removes "
                                                 f"{REMOTE_ROOT}/ (all the device tasks put there) from a phone; "
                                                 "`cpu-runtime DIR` makes the CPU baseline's runtime folder "
                                                 "(BUILD_RULES_CPU_RUNTIME).")
    parser.add_argument("command", choices=("list", "clean", "cpu-runtime"))
    parser.add_argument("folder", nargs="?", metavar="PHONE|DIR",
                        help="clean: the phone (its devices.toml name, or a serial); cpu-runtime: the folder to make")
    parser.add_argument("--wheel", help="cpu-runtime: an onnxruntime manylinux aarch64 wheel (default: pip download)")
    parser.add_argument("--chips", default="chips.toml", help="the repo's chips.toml (default: ./chips.toml)")
    args = parser.parse_args(argv)
    if args.command == "cpu-runtime":
        return _cpu_runtime(args, parser)
    if args.command == "clean" and not args.folder:
        parser.error("clean needs the phone: its devices.toml name or its serial")
    from ..configuration.config import ConfigError, load_chips
    try:
        chips = load_chips(Path(args.chips)).chips
        if args.command == "clean":
            print(clean(args.folder, chips))
            return 0
        text, problems = listing(chips)
    except (DeviceError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if text:
        print(f"# paste into {DEVICES_FILE} (beside chips.toml)\n" + text)
    else:
        print("# no phone ready: `adb devices -l` lists none in state 'device'")
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)
    return 0


def _cpu_runtime(args, parser) -> int:
    from .cpu_runtime import ENV, build
    if not args.folder:
        parser.error("cpu-runtime needs the folder to make")
    try:
        root = build(Path(args.folder), Path(args.wheel) if args.wheel else None)
    except DeviceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{root}: ort-cpu-run, libonnxruntime.so.1 and the aarch64 glibc it needs; set {ENV}={root.resolve()}")
    return 0

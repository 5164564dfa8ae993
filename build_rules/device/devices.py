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

from .. import layout
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


def load_devices(path: Path, chips: dict) -> dict[str, Device]:
    """[devices.<name>] tables of devices.toml; a soc that maps to no chip in chips.toml is refused naming both."""
    path = Path(path)
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise DeviceError(f"{path}: not valid TOML: {e}") from None
    unknown = set(data) - {"devices"}
    if unknown:
        raise DeviceError(f"{path}: unknown top-level key(s) {sorted(unknown)}: only [devices.<name>] tables go here")
    found = {}
    for name, entry in (data.get("devices") or {}).items():
        where = f"{path} [devices.{name}]"
        if not NAME.match(name):
            raise DeviceError(f"{where}: a device name is letters, digits, '_', '.', '-' (it is part of task names)")
        if not isinstance(entry, dict):
            raise DeviceError(f"{where}: expected a table with serial and soc")
        extra = set(entry) - {"serial", "soc", "model", "fingerprint"}
        if extra:
            raise DeviceError(f"{where}: unknown key(s) {sorted(extra)} (known: serial, soc, model, fingerprint)")
        for key in ("serial", "soc"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise DeviceError(f"{where}: {key} is missing (a string; `python -m build_rules.device list` "
                                  "prints it)")
        if entry["soc"] not in chips:
            raise DeviceError(f"{where}: soc = {entry['soc']!r} (the phone's ro.soc.model) maps to no chip in "
                              f"chips.toml (chips: {', '.join(chips)}); add [chips.{entry['soc']}] with its soc_id and "
                              "dsp_arch to chips.toml, or fix the soc")
        found[name] = Device(name=name, serial=entry["serial"], soc=entry["soc"], model=entry.get("model", ""))
    return found


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


def main(argv: list[str] | None = None) -> int:
    import argparse
    parser = argparse.ArgumentParser(prog="python -m build_rules.device",
                                     description="Phones over adb: `list` prints a [devices.<name>] table per phone "
                                                 "plugged in, to paste into devices.toml; `cpu-runtime DIR` makes "
                                                 "the CPU baseline's runtime folder (BUILD_RULES_CPU_RUNTIME).")
    parser.add_argument("command", choices=("list", "cpu-runtime"))
    parser.add_argument("folder", nargs="?", help="cpu-runtime: the folder to make (then BUILD_RULES_CPU_RUNTIME)")
    parser.add_argument("--wheel", help="cpu-runtime: an onnxruntime manylinux aarch64 wheel (default: pip download)")
    parser.add_argument("--chips", default="chips.toml", help="the repo's chips.toml (default: ./chips.toml)")
    args = parser.parse_args(argv)
    if args.command == "cpu-runtime":
        return _cpu_runtime(args, parser)
    from ..config import ConfigError, load_chips
    try:
        chips = load_chips(Path(args.chips)).chips
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

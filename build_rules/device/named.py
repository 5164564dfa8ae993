"""The phones this build's devices.toml names (read once per file version), and why a device task does not exist.

TOML only, light: `doit list` and every build read it (tasks/device.py's generators, doit_config's warning and
install()); nothing here calls adb.

Why a device task does not exist (issue 37): `doit device_check:m/g/v@s25` with no devices.toml, with one that does
not name s25, or with a mistake in s25's table (no serial, a soc that maps to no chip) names no task, and doit
answered `Invalid parameter: "...". Must be a command, task, or a target.` doit reports an unknown name in one place,
TaskControl._filter_tasks (InvalidCommand with not_found); install() wraps it, so such a name gets the devices.toml
line or how to write the table, printed as doit prints any command-line mistake (`ERROR: ...`, exit 3). Any other
unknown name keeps doit's message.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

from .devices import DEVICES_FILE, Devices, load_devices, unknown_device

DEVICE_TASK = re.compile(r"^(device_check|profile|power):[^@\s]+@([^@\s]+)$")


@functools.cache
def _cached(path: str, mtime_ns: int, chips: tuple) -> Devices:
    return load_devices(Path(path), dict.fromkeys(chips))


def device_file() -> Devices:
    """devices.toml beside chips.toml: the phones it names well and its mistakes, one line each."""
    from ..doit_run.project import project
    path = Path(DEVICES_FILE)
    mtime = path.stat().st_mtime_ns if path.is_file() else 0
    return _cached(str(path), mtime, tuple(project().chips.chips))


def explain(name: str) -> str | None:
    """Why the device task `name` does not exist, or None (not a device task's name, or its phone has tasks: then
    another part of the name is wrong, which doit's own message covers)."""
    found = DEVICE_TASK.match(name)
    if not found:
        return None
    devices = device_file()
    if found.group(2) in devices.found:
        return None
    return f"{name}: {unknown_device(devices, found.group(2))}"


def install() -> None:
    """Once per process (doit_config runs at every load; tests load many times in one process)."""
    from doit.control import TaskControl
    if getattr(TaskControl._filter_tasks, "build_rules", False):
        return
    original = TaskControl._filter_tasks

    def _filter_tasks(self, task_selection):
        from doit.exceptions import InvalidCommand
        try:
            return original(self, task_selection)
        except InvalidCommand as e:
            why = explain(e.not_found) if e.not_found else None
            if why is None:
                raise
            raise InvalidCommand(why) from None
    _filter_tasks.build_rules = True
    TaskControl._filter_tasks = _filter_tasks

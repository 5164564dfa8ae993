"""A device task doit does not know: say why, instead of doit's "Invalid parameter" (issue 37).

`doit device_check:m/g/v@s25` with no devices.toml, with one that does not name s25, or with a mistake in s25's table
(no serial, a soc that maps to no chip) names no task, and doit answers `Invalid parameter: "...". Must be a command,
task, or a target.` Here the name is looked at where doit reports it (TaskControl._filter_tasks raises
InvalidCommand(not_found=...)): a device task's name whose phone has no tasks gets the devices.toml line, or how to
write the table. doit still prints it as any command-line mistake (`ERROR: ...`, exit 3). Any other unknown name
keeps doit's message.
"""
from __future__ import annotations

import re

DEVICE_TASK = re.compile(r"^(device_check|profile|power):[^@\s]+@([^@\s]+)$")


def explain(name: str) -> str | None:
    """Why the device task `name` does not exist, or None (not a device task, or its phone has tasks)."""
    found = DEVICE_TASK.match(name)
    if not found:
        return None
    from ..device.devices import unknown_device
    from .device import device_file
    devices = device_file()
    if found.group(2) in devices.found:
        return None  # the phone is there: another part of the name is wrong, which doit's message covers
    return f"{name}: {unknown_device(devices, found.group(2))}"


def install() -> None:
    """Wrap doit's task selection once per process (doit_config runs at every load; tests load many times)."""
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

"""adb as a subprocess, with its real output formats: `adb devices -l`, `adb -s S shell`, push, pull.

A remote command's exit code: adb's shell protocol (adb 1.0.35+, Android 7+) returns it, but adb's own failures (a
device that went away: "adb: device 'S' not found", exit 1) use the same codes. So every remote command ends with
`; echo __BUILD_RULES_RC=$?`: no marker in the output means adb, not the command, failed, and the error says so.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess

from .errors import DeviceError

MARK = "__BUILD_RULES_RC="


def adb_path() -> str:
    found = shutil.which("adb")
    if found is None:
        raise DeviceError("adb is not on PATH: install Android platform-tools (e.g. `apt install adb`, or the SDK's "
                          "platform-tools folder on PATH)")
    return found


def parse_devices(text: str) -> list[dict]:
    """`adb devices -l`: 'List of devices attached', then per phone '<serial> <state> [usb:..] product:.. model:..
    device:.. transport_id:N' (serial padded to 22 columns; each qualifier after a space)."""
    found = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("List of devices") or line.startswith("*"):  # "* daemon started ..."
            continue
        parts = line.split()
        if len(parts) < 2:
            continue
        entry = {"serial": parts[0], "state": parts[1]}
        rest = parts[2:]
        if parts[1] == "no" and len(parts) > 2 and parts[2] == "permissions":  # "no permissions (...)"
            entry["state"], rest = "no permissions", []
        for item in rest:
            key, sep, value = item.partition(":")
            if sep and key in ("product", "model", "device", "transport_id", "usb"):
                entry[key] = value
        found.append(entry)
    return found


def devices() -> list[dict]:
    code, out, err = _run([adb_path(), "devices", "-l"], timeout=30)
    if code != 0:
        raise DeviceError(f"`adb devices -l` failed (exit {code}): {err.strip() or out.strip()}")
    return parse_devices(out)


def _run(cmd: list[str], timeout: float | None = None) -> tuple[int, str, str]:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise DeviceError(f"`{' '.join(cmd[:6])} ...` did not answer in {timeout:.0f} s (is the phone awake and "
                          "still plugged in?)") from None
    return done.returncode, done.stdout, done.stderr


class Adb:
    """One phone by serial. Every failure of adb itself is a DeviceError naming the serial and the command."""

    def __init__(self, serial: str, name: str | None = None):
        self.serial = serial
        self.name = name or serial
        self.adb = adb_path()

    def _fail(self, what: str, code: int, text: str) -> DeviceError:
        text = text.strip()
        gone = re.search(r"device '.*' not found|no devices/emulators found|device offline|error: closed|"
                         r"device unauthorized", text)
        hint = (f"; the phone {self.name} ({self.serial}) is not connected any more: plug it in, check "
                "`adb devices -l`, then run the task again" if gone else "")
        return DeviceError(f"adb -s {self.serial} {what} failed (adb exit {code}): {text or 'no output'}{hint}")

    def check_ready(self) -> None:
        listed = {d["serial"]: d for d in devices()}
        if self.serial not in listed:
            raise DeviceError(f"phone {self.name} (serial {self.serial}, devices.toml) is not plugged in: `adb "
                              f"devices -l` lists {', '.join(listed) or 'no phone'}")
        state = listed[self.serial]["state"]
        if state != "device":
            fix = {"unauthorized": "accept the USB debugging prompt on the phone",
                   "offline": "unplug and plug it in again, or `adb kill-server`"}.get(state, "check the cable and "
                                                                                       "USB debugging")
            raise DeviceError(f"phone {self.name} ({self.serial}) is '{state}' in `adb devices -l`: {fix}")

    def getprop(self, prop: str) -> str:
        return self.shell(f"getprop {shlex.quote(prop)}").strip()

    def shell(self, command: str, check: bool = True, timeout: float | None = None) -> str:
        """The remote command's stdout (stderr joined); a non-zero remote exit fails when check is set."""
        code, output = self.shell_code(command, timeout)
        if check and code != 0:
            raise DeviceError(f"on {self.name} ({self.serial}): `{command}` exited with {code}:\n"
                              + "\n".join(output.strip().splitlines()[-20:]))
        return output

    def shell_code(self, command: str, timeout: float | None = None) -> tuple[int, str]:
        code, out, err = _run([self.adb, "-s", self.serial, "shell", f"{command}; echo {MARK}$?"], timeout)
        at = out.rfind(MARK)
        if at < 0:
            raise self._fail(f"shell '{command[:120]}'", code, err or out)
        remote = int(out[at + len(MARK):].split()[0])
        return remote, out[:at] + (err if err else "")

    def push(self, local: str | os.PathLike, remote: str) -> None:
        code, out, err = _run([self.adb, "-s", self.serial, "push", str(local), remote])
        if code != 0:
            raise self._fail(f"push {local} {remote}", code, err or out)

    def pull(self, remote: str, local: str | os.PathLike) -> None:
        code, out, err = _run([self.adb, "-s", self.serial, "pull", remote, str(local)])
        if code != 0:
            raise self._fail(f"pull {remote} {local}", code, err or out)

    def popen_shell(self, command: str) -> subprocess.Popen:
        """A long remote command (power's loop), its output read as it comes."""
        return subprocess.Popen([self.adb, "-s", self.serial, "shell", command], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

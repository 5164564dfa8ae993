"""adb as a subprocess, with its real output formats: `adb devices -l`, `adb -s S shell`, push, pull.

A remote command's exit code: adb's shell protocol (adb 1.0.35+, Android 7+) returns it, but adb's own failures (a
device that went away: "adb: device 'S' not found", exit 1) use the same codes. So every remote command ends with
`; echo __BUILD_RULES_RC=$?`: no marker in the output means adb, not the command, failed, and the error says so.

Every call has a timeout (issue 37: a phone that stopped answering hung the task): a bounded default per kind of
command (SECONDS), longer for pushes and pulls, and for the commands that run the model (qnn-net-run, ort-cpu-run:
run_seconds(), BUILD_RULES_PHONE_RUN_TIMEOUT) and power's loop (its duration). An expired one is a DeviceError naming
the command and the phone.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess

from .errors import DeviceError
from ..plumbing.env_settings import number

MARK = "__BUILD_RULES_RC="
# seconds an adb call may take, per kind: a short command on the phone (getprop, sha256sum, cat, kill ...), one push
# (a 100 MB binary or the 31 MB CPU runtime over USB 2 is well under a minute), a pull of one output folder
SECONDS = {"devices": 30, "shell": 120, "push": 900, "pull": 600}
RUN_ENV = "BUILD_RULES_PHONE_RUN_TIMEOUT"  # one qnn-net-run / ort-cpu-run over the samples (default 1800 s)


def run_seconds() -> float:
    """The timeout of a command that runs the model on the phone."""
    return float(number(RUN_ENV, 1800, more_than=0, error=DeviceError, what="a number of seconds > 0 (e.g. 3600)"))


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
    code, out, err = _run([adb_path(), "devices", "-l"], timeout=SECONDS["devices"])
    if code != 0:
        raise DeviceError(f"`adb devices -l` failed (exit {code}): {err.strip() or out.strip()}")
    return parse_devices(out)


def _run(cmd: list[str], timeout: float, phone: str = "") -> tuple[int, str, str]:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        shown = " ".join(cmd[1:])
        shown = shown if len(shown) <= 200 else shown[:200] + " ..."
        raise DeviceError(f"`adb {shown}` did not finish in {timeout:.0f} s{phone}: is the phone awake, unlocked and "
                          "still plugged in (`adb devices -l`)? A model run that needs longer: "
                          f"{RUN_ENV}=<seconds>") from None
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

    def _run(self, args: list[str], kind: str, timeout: float | None = None) -> tuple[int, str, str]:
        return _run([self.adb, "-s", self.serial, *args], timeout or SECONDS[kind],
                    f" on the phone {self.name} ({self.serial})")

    def shell(self, command: str, check: bool = True, timeout: float | None = None) -> str:
        """The remote command's stdout (stderr joined); a non-zero remote exit fails when check is set. timeout: for
        a command that runs longer than SECONDS["shell"] (a model run: run_seconds())."""
        code, output = self.shell_code(command, timeout)
        if check and code != 0:
            raise DeviceError(f"on {self.name} ({self.serial}): `{command}` exited with {code}:\n"
                              + "\n".join(output.strip().splitlines()[-20:]))
        return output

    def shell_code(self, command: str, timeout: float | None = None) -> tuple[int, str]:
        code, out, err = self._run(["shell", f"{command}; echo {MARK}$?"], "shell", timeout)
        at = out.rfind(MARK)
        if at < 0:
            raise self._fail(f"shell '{command[:120]}'", code, err or out)
        remote = int(out[at + len(MARK):].split()[0])
        return remote, out[:at] + (err if err else "")

    def push(self, local, remote: str) -> None:
        """`adb push LOCAL... REMOTE`: one file or folder to a path, or several into the folder `remote` (which must
        exist on the phone: adb refuses several LOCALs into a path that is no folder)."""
        sources = [str(p) for p in (local if isinstance(local, (list, tuple)) else [local])]
        code, out, err = self._run(["push", *sources, remote], "push", SECONDS["push"] * max(1, len(sources) // 20))
        if code != 0:
            shown = sources[0] + (f" (and {len(sources) - 1} more)" if len(sources) > 1 else "")
            raise self._fail(f"push {shown} {remote}", code, err or out)

    def pull(self, remote: str, local: str | os.PathLike) -> None:
        code, out, err = self._run(["pull", remote, str(local)], "pull")
        if code != 0:
            raise self._fail(f"pull {remote} {local}", code, err or out)

"""The phone's thermal state around a profile run, and whether a run's spread says it was noisy or throttled.

Read with `dumpsys thermalservice`, which the adb shell user may run without root (the shell holds DUMP):
"Thermal Status: N" (Android's PowerManager THERMAL_STATUS_*: 0 none, 1 light, 2 moderate, 3 severe, 4 critical,
5 emergency, 6 shutdown; 1 and above means the system throttles) and the HAL's temperatures, lines
"Temperature{mValue=36.2, mType=0, mName=cpu0, mStatus=0}" under "Current temperatures from HAL:" (else "Cached
temperatures:"; mType 0 CPU, 1 GPU, 2 battery, 3 skin). /sys/class/thermal is not used: SELinux denies the shell
most thermal zones on recent Android. A phone without the service gives `available: false` and the reason.
"""
from __future__ import annotations

import re

STATUS = ("none", "light", "moderate", "severe", "critical", "emergency", "shutdown")
TYPES = {0: "cpu", 1: "gpu", 2: "battery", 3: "skin"}
NOISY_SPREAD = 1.5  # p90 above 1.5 x the median: the runs did not settle (BUILD_RULES_PROFILE_SPREAD)


def read(adb) -> dict:
    code, text = adb.shell_code("dumpsys thermalservice")
    found = re.search(r"^\s*Thermal Status:\s*(\d+)", text, re.M)
    if code != 0 or not found:
        return {"available": False, "reason": f"`dumpsys thermalservice` gave no 'Thermal Status' "
                                              f"(exit {code}): {text.strip()[:200]}"}
    status = int(found.group(1))
    section = "Current temperatures from HAL:" if "Current temperatures from HAL:" in text else "Cached temperatures:"
    temperatures = {}
    for line in text.split(section, 1)[1].splitlines()[1:] if section in text else []:
        entry = re.search(r"Temperature\{mValue=([-\d.]+), mType=(\d+), mName=([^,]+),", line)
        if not entry:
            break
        temperatures[entry.group(3)] = {"celsius": float(entry.group(1)),
                                        "type": TYPES.get(int(entry.group(2)), int(entry.group(2)))}
    hottest = {kind: max((t["celsius"] for t in temperatures.values() if t["type"] == kind), default=None)
               for kind in ("cpu", "skin")}
    return {"available": True, "status": status, "status_name": STATUS[status] if status < len(STATUS) else str(status),
            "cpu_max_c": hottest["cpu"], "skin_max_c": hottest["skin"], "temperatures": temperatures}


def judge(median: float, p90: float, before: dict, after: dict, spread_limit: float = NOISY_SPREAD) -> list[str]:
    """Why a run's numbers may not stand for the phone at rest (empty: none found)."""
    flags = []
    if median and p90 / median > spread_limit:
        flags.append(f"noisy: p90 {p90:.3g} ms is {p90 / median:.2f}x the median {median:.3g} ms (> {spread_limit:g}x)")
    if after.get("available") and after["status"] >= 1:
        flags.append(f"throttled: thermal status {after['status_name']} ({after['status']}) after the run")
    elif before.get("available") and after.get("available") and after["status"] > before["status"]:
        flags.append(f"warmed: thermal status {before['status_name']} -> {after['status_name']}")
    return flags


def describe(reading: dict) -> str:
    if not reading.get("available"):
        return "thermal state not read"
    temps = ", ".join(f"{k} {reading[f'{k}_max_c']:.1f} C" for k in ("cpu", "skin")
                      if reading.get(f"{k}_max_c") is not None)
    return f"thermal {reading['status_name']}" + (f" ({temps})" if temps else "")

"""The phone tasks' settings from the environment, read while their tasks are made (tasks/device.py) and judged
before any task is (tasks/__init__.py doit_config): a value that is not one is a ConfigError naming the setting.
A light leaf module: the loader imports it."""
from __future__ import annotations

import os

from ..errors import ConfigError

POWER_SECONDS_ENV = "BUILD_RULES_POWER_SECONDS"  # power's fixed task per path (seed: 30-60 min)
POWER_SECONDS_DEFAULT = 1800
PROFILE_RUNS_ENV = "BUILD_RULES_PROFILE_RUNS"
PROFILE_RUNS_DEFAULT = 20


def power_seconds() -> float:
    """BUILD_RULES_POWER_SECONDS as seconds > 0 (unset: the default); a ConfigError names the setting otherwise."""
    asked = os.environ.get(POWER_SECONDS_ENV, "").strip()
    if not asked:
        return float(POWER_SECONDS_DEFAULT)
    try:
        seconds = float(asked)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise ConfigError(f"{POWER_SECONDS_ENV}={asked!r} is not a number of seconds > 0 (each power loop's length); "
                          f"unset it for the default {POWER_SECONDS_DEFAULT}")
    return seconds


def profile_runs() -> int:
    """BUILD_RULES_PROFILE_RUNS as a whole number >= 1 (unset: the default); a ConfigError otherwise."""
    asked = os.environ.get(PROFILE_RUNS_ENV, "").strip()
    if not asked:
        return PROFILE_RUNS_DEFAULT
    if not asked.isdigit() or int(asked) < 1:
        raise ConfigError(f"{PROFILE_RUNS_ENV}={asked!r} is not a whole number of runs >= 1; unset it for the "
                          f"default {PROFILE_RUNS_DEFAULT}")
    return int(asked)


def check_settings() -> None:
    """The device settings read at load, judged before any task is made (doit_config): a mistake is one line."""
    power_seconds()
    profile_runs()

"""The phone tasks' settings from the environment, read while their tasks are made (tasks/device.py) and judged
before any task is (tasks/__init__.py doit_config): a value that is not one is a ConfigError naming the setting.
A light leaf module: the loader imports it."""
from __future__ import annotations

from ..errors import ConfigError
from ..plumbing.env_settings import number

POWER_SECONDS_ENV = "BUILD_RULES_POWER_SECONDS"  # power's fixed task per path (seed: 30-60 min)
POWER_SECONDS_DEFAULT = 1800
POWER_SAMPLE_ENV = "BUILD_RULES_POWER_SAMPLE"  # seconds between two reads of the loop's /proc/<pid>/stat
POWER_SAMPLE_DEFAULT = 2
PROFILE_RUNS_ENV = "BUILD_RULES_PROFILE_RUNS"
PROFILE_RUNS_DEFAULT = 20


def power_seconds() -> float:
    """BUILD_RULES_POWER_SECONDS as seconds > 0 (unset: the default); a ConfigError names the setting otherwise."""
    return float(number(POWER_SECONDS_ENV, POWER_SECONDS_DEFAULT, more_than=0, error=ConfigError,
                        what="a number of seconds > 0 (each power loop's length)"))


def power_sample_seconds() -> float:
    """BUILD_RULES_POWER_SAMPLE: seconds between two reads of the loop's CPU time (> 0; a ConfigError otherwise)."""
    return float(number(POWER_SAMPLE_ENV, POWER_SAMPLE_DEFAULT, more_than=0, error=ConfigError,
                        what="a number of seconds > 0 (between two reads of a power loop's CPU time)"))


def profile_runs() -> int:
    """BUILD_RULES_PROFILE_RUNS as a whole number >= 1 (unset: the default); a ConfigError otherwise."""
    return number(PROFILE_RUNS_ENV, PROFILE_RUNS_DEFAULT, whole=True, least=1, error=ConfigError,
                  what="a whole number of runs >= 1")


def check_settings() -> None:
    """The device settings read at load, judged before any task is made (doit_config): a mistake is one line."""
    power_seconds()
    power_sample_seconds()
    profile_runs()

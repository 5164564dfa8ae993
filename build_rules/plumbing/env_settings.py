"""The tool's numeric settings from the environment (BUILD_RULES_*): one reader, so that every one of them takes a
blank value as unset and refuses a bad one with the same line, naming the variable, the value, what it must be and
the default: `BUILD_RULES_X='abc' is not a whole number >= 1; unset it for the default 2`."""
from __future__ import annotations

import math
import os


def number(name: str, default, *, what: str, whole: bool = False, least: float | None = None,
           more_than: float | None = None, error: type[Exception] = ValueError, default_said: str | None = None,
           environ=None):
    """os.environ[name] as an int (whole) or a float; `default` when unset or blank. A value that is not a finite
    number, not whole when asked, below `least` or not above `more_than` raises `error` with the setting's line
    (`what`: what it must be, e.g. "a number of seconds > 0"; default_said: how to say the default, if not as is;
    environ: another mapping to read than os.environ)."""
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw) if whole else float(raw)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or (least is not None and value < least) \
            or (more_than is not None and value <= more_than):
        said = default if default_said is None else default_said
        raise error(f"{name}={raw!r} is not {what}; unset it for the default {said}")
    return value

"""Errors a user can act on. Their message is shown as is, without a traceback."""


class BuildError(Exception):
    """A stage failed for a reason the user must fix: the message names file, tensor, op or metric."""


class ConfigError(BuildError):
    """A config file is wrong; the message names the file and the key."""


def did_you_mean(name: str, known) -> str:
    """'; did you mean 'x'?' for the closest known name to a mistyped one (a metric, tensor or node), or ''."""
    import difflib
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


# How to add AIMET to the tool as installed (a wheel, a path or an editable clone alike), keeping torch at its exact
# pin. The version is pyproject.toml's `aimet` extra (tests/test_aimet.py checks that they agree).
AIMET_INSTALL = "pip install 'aimet-onnx==2.42.0' 'torch==2.13.0'"

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

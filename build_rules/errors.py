"""Errors a user can act on. Their message is shown as is, without a traceback."""


class BuildError(Exception):
    """A stage failed for a reason the user must fix: the message names file, tensor, op or metric."""

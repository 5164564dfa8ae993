"""Builds QNN HTP context binaries for every model in models/ and chip in chips.toml (see README.md)."""
from build_rules.tasks import *  # noqa: F401,F403 -- the stage generators (task_*) and doit_config

DOIT_CONFIG = doit_config()

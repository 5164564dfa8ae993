"""Builds QNN HTP context binaries for every model in models/ and chip in chips.toml (see README.md)."""
from build_rules.tasks import (task_calibrate, task_check, task_chips, task_compile, task_export,  # noqa: F401
                               task_models, task_package, task_quantize, task_simplify, task_verify, doit_config)

DOIT_CONFIG = doit_config()

"""Builds QNN HTP context binaries for every model in models/ and chip in chips.toml (see README.md)."""
from build_rules.tasks import (task_calibrate, task_check, task_chips, task_compile, task_convert,  # noqa: F401
                               task_export, task_htp_config, task_model_libs, task_models, task_package,
                               task_quantize, task_simplify, task_verify, doit_config)

DOIT_CONFIG = doit_config()

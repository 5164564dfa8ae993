"""Stage htp_config (qairt toolchain, in-process: it only writes two small JSON files): a graph's
htp_backend_extensions.json + htp_config.json for one chip, which qnn-context-binary-generator reads."""
from __future__ import annotations

import json
from pathlib import Path

from ..plumbing.files import atomic_write_text
from ..toolchains import qairt


def run(params: dict) -> None:
    sdk = qairt.Sdk(Path(params["sdk"]))
    extensions, config = qairt.htp_config_files(sdk, params["graph_name"], params["chip"], params["config_abs"])
    atomic_write_text(params["outputs"]["config"], json.dumps(config, indent=4) + "\n")
    atomic_write_text(params["outputs"]["extensions"], json.dumps(extensions, indent=4) + "\n")

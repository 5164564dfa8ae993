"""Entry point of a stage process: python -m build_rules.stage_main <stage> <staging folder>.

Reads params.json from the staging folder, calls build_rules.stages.<stage>.run(params) and writes
result.json: {"values": {...}} on success, {"error": "..."} for a BuildError (a message meant for
the user; no traceback). Any other exception prints its traceback to the log and exits non-zero.
"""
import importlib
import json
import sys
from pathlib import Path

from .errors import BuildError


def main(stage: str, staging: str) -> int:
    folder = Path(staging)
    params = json.loads((folder / "params.json").read_text())
    module = importlib.import_module(f"build_rules.stages.{stage}")
    try:
        values = module.run(params) or {}
    except BuildError as e:
        print(f"error: {e}", flush=True)
        (folder / "result.json").write_text(json.dumps({"error": str(e)}))
        return 2
    (folder / "result.json").write_text(json.dumps({"values": values}))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))

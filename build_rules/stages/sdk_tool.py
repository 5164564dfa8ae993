"""Running one QAIRT SDK command-line tool from a stage, with its whole output kept in the stage's log.

The stage's stdout is its log file beside the outputs (runner.run_stage), one log per stage and graph, so a
later stage never overwrites an earlier tool's log (sherpa-onnx's context-binary log overwrote the
lib-generator's).
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys


def run_tool(cmd: list[str], env: dict | None = None) -> tuple[int, str]:
    """Run `cmd` (stdout and stderr merged); echo the command line and the output to the log; return both."""
    print("$ " + shlex.join(cmd), flush=True)
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    except OSError as e:  # not executable, bad interpreter line, ...
        print(f"cannot run {cmd[0]}: {e}", flush=True)
        return 127, str(e)
    text = proc.stdout.decode("utf-8", errors="replace")
    sys.stdout.write(text)
    print(f"[exit code {proc.returncode}]", flush=True)
    return proc.returncode, text


def tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def short(path) -> str:
    """A path inside the build's folder as a relative one: shorter command lines in the logs."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative

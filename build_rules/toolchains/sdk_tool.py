"""Running one QAIRT SDK command-line tool from a stage, with its whole output kept in the stage's log.

Every tool runs in the environment bin/envsetup.sh would make, built from the SDK's folder alone
(toolchains.qairt.tool_env): nobody has to source envsetup.sh first.
The stage's stdout is its log file beside the outputs (runner.run_stage), one log per stage and graph, so a
later stage never overwrites an earlier tool's log (sherpa-onnx's context-binary log overwrote the
lib-generator's).
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys


def run_tool(cmd: list[str], sdk, extra_env: dict | None = None) -> tuple[int, str]:
    """Run `cmd` (stdout and stderr merged) with the SDK's environment; echo the command line and the output to
    the log; return both."""
    from ..toolchains.qairt import tool_env

    env = dict(tool_env(sdk), **(extra_env or {}))
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


def onnx_nodes(onnx_path: str) -> list[tuple[str, str]]:
    """(node name, op type) of every node of an ONNX model, to name the culprit of a QNN failure."""
    import onnx
    return [(n.name, n.op_type) for n in onnx.load(onnx_path, load_external_data=False).graph.node]


def check_converter_output(where: str, tool: str, code: int, text: str, onnx_path: str) -> dict:
    """Fail on an op the converter cannot translate (naming node, op type and fix) or on a non-zero exit; return
    the log's findings (quantization warnings). WARNING lines never fail."""
    from ..errors import BuildError
    from ..toolchains.qairt_outputs import onnx_op_type, rejection_message, scan_converter_log

    found = scan_converter_log(text)
    if found["rejected"]:
        nodes = onnx_nodes(onnx_path)
        ops_by_type = {op.lower(): op for _, op in nodes}
        messages = []
        for r in found["rejected"]:
            op_type = onnx_op_type(r["op"], ops_by_type)
            same = [name for name, op in nodes if op == op_type]
            node = r["node"] or (same[0] if same else "?")
            extra = f" ({len(same)} {op_type} nodes in the model)" if len(same) > 1 else ""
            messages.append(rejection_message(
                node, op_type, r["text"] + extra,
                f"{tool} has no translation for {op_type}: change the export so that the model has no {op_type} "
                "node (express it with ops QNN supports), then rebuild"))
        raise BuildError(f"{where}: " + "; ".join(messages))
    if code != 0:
        raise BuildError(f"{where} failed with exit code {code}:\n{tail(text)}")
    return found


def overrides_file(params: dict) -> str | None:
    """Write the graph's --quantization_overrides file (tensor and node overrides, resolved against its ONNX model)
    when the task has one; its path for the command line, else None. Both converters take the same file. A variant
    quantized by AIMET passes the aimet stage's encodings instead (its overrides are already in them)."""
    if params.get("encodings"):
        return short(params["encodings"])
    path = params["outputs"].get("overrides")
    if not path:
        return None
    from ..plumbing.files import atomic_write_json
    from ..toolchains import qairt
    atomic_write_json(path, qairt.overrides_json(qairt.tensor_overrides(params["onnx"], params["variant"],
                                                                        params["name"])))
    return short(path)

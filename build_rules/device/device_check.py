"""device_check:<model>/<graph>/<variant>@<device>: the chip's context binary on the phone's NPU over the graph's
evaluation inputs, judged with the graph's gates exactly as the check stage judges the emulator (check.measure,
check.summarize, gates.results/judge: one judgement).

Inputs are the evaluation set verify saved (.evaluation.npz), written as float32 raw files with an input_list.txt
of `<tensor>:=<path>` lines (qnn-net-run quantizes float inputs with the binary's encodings and writes float
outputs, Result_<n>/<tensor>.raw); outputs are read back through the binary's I/O contract: ort-qnn's
<graph>_ctx.onnx, or the qairt flow's _net.json / info.json with its layouts (target.py). A split graph's parts run
in order, the tensors crossing each cut handed on (on_phone.py), and the final outputs are judged. The result file <graph>.device.<device>.json beside the binary records
chip, phone model, build fingerprint, runtime, binary digest, quantization and the numbers, keyed on the binary,
the runtime's identity, the phone's fingerprint, the evaluation set and the hooks: the same key judges the saved
numbers again without running the phone. Every sample runs twice, and the two runs' bytes are compared: a binary
that gives other outputs on the phone fails, its numbers the worst run's (the emulator does that for some 16-bit
binaries: docs/building.md). It is written only when the phone run finished; a failed run keeps an
older result, marked `stale` (when and why: results.mark_stale), so no file claims to be of the current binary,
runtime or phone build when it is not.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from ..emulator import repeats
from ..errors import BuildError
from ..plumbing.files import atomic_write_json
from .errors import DeviceError
from .push import sha256
from .results import mark_stale
from .session import open_phone, runtime_identity

VERSION = 2  # 2: every sample runs twice; "repeats": whether the phone gave the same bytes


def run(params: dict):
    """doit action: True, or a TaskFailed with the message (no traceback: the fix is the user's)."""
    from doit.exceptions import TaskFailed
    try:
        check(params)
    except (DeviceError, BuildError) as e:
        return TaskFailed(str(e) if str(e).startswith(params["name"]) else f"{params['name']}: {e}")
    return True


def _key(params: dict, phone, identity: dict) -> dict:
    from ..stages.check import hooks_digest
    runtime = {k: v for k, v in identity.items() if k != "root"}  # where the SDK is unpacked changes nothing
    return {"version": VERSION, "binary": binary_digests(params), "runtime": runtime,
            "fingerprint": phone.fingerprint, "evaluation": sha256(params["evaluation"]),
            "hooks": hooks_digest(params["hooks"]), "gates": params["gates"]}


def binary_digests(params: dict) -> str | dict:
    """The binary's sha256; a split graph's: part -> sha256, in order."""
    parts = params["target"]["parts"]
    if len(parts) == 1:
        return sha256(parts[0]["binary"])
    return {p["name"]: sha256(p["binary"]) for p in parts}


def check(params: dict) -> dict:
    from ..measuring import gates
    from ..measuring.samples import load_evaluation, load_labels
    from ..stages import check as check_stage
    from .on_phone import run_graph
    from .target import parts as read_parts

    result_path = Path(params["outputs"]["result"])
    phone = open_phone(params)
    try:
        saved = json.loads(result_path.read_text())
    except (OSError, ValueError):
        saved = None
    parts = read_parts(params["name"], params["target"])
    inputs, reference = load_evaluation(params["evaluation"])
    found = {}

    def keyed(runs) -> bool:  # before the first part runs: the same key judges the saved numbers again
        if len(runs) == 1:
            found["identity"] = runtime_identity(phone, runs[0].pushed)
            found["key"] = _key(params, phone, found["identity"])
            if saved and saved.get("key") == found["key"]:
                found["saved"] = True
                return False
        return True
    shapes = {n: v.shape for n, v in reference[0].items()} if reference else None
    with tempfile.TemporaryDirectory(prefix="build-rules-device-") as tmp:
        try:
            outputs, _ = run_graph(phone, params, params["graph"], parts, inputs, Path(tmp), "outputs",
                                   shapes=shapes, before=keyed)
            if not found.get("saved"):  # does the phone's runtime repeat itself? The same samples once more
                again, _ = run_graph(phone, params, params["graph"], parts, inputs, Path(tmp, "again"), "outputs",
                                     shapes=shapes)
        except (DeviceError, BuildError) as e:
            if saved and "key" in saved:  # another binary/runtime/phone build's numbers: kept, marked stale
                mark_stale(result_path, saved, str(e))
            raise
    identity, key = found["identity"], found["key"]
    if found.get("saved"):
        print(f"{result_path}: measured on {phone.adb.name} from the same binary, runtime, phone build, "
              "evaluation set and hooks: judged again, not run again", flush=True)
        metrics = saved["metrics"]
    else:
        runs = [repeats.Outputs(first, [second]) for first, second in zip(outputs, again)]
        shown = repeats.shown(runs)
        per_run = [check_stage.measure(params["hooks"], params["graph"], params.get("data_dir"), inputs, reference,
                                       [o.run(r) for o in runs], load_labels(params["evaluation"]))
                   for r in range(1 if shown["repeats"] else 2)]
        metrics = {**check_stage.worst_of_runs(per_run, params["gates"]), "repeats": shown}
        print(f"{phone.adb.name}: " + ("the binary repeated itself on the phone: two runs of every sample gave the "
                                        "same bytes" if shown["repeats"] else
                                        f"the binary does not repeat itself on the phone: {repeats.describe(shown)}"),
              flush=True)
    summary = check_stage.summarize(metrics)
    gated = gates.results(params["gates"], summary, metrics.get("float_score"))
    passed = gates.passes_all(params["gates"], summary, metrics.get("float_score"))
    record = {"chip": params["chip"]["name"], "device": params["device"]["name"], "serial": params["device"]["serial"],
              "phone_model": phone.product, "fingerprint": phone.fingerprint, "soc": phone.soc,
              "runtime": {"version": identity["version"], "build_id": identity["build_id"]},
              "binary_sha256": key["binary"], "variant": params["variant"], "quantization": params["quantization"],
              "toolchain": params["target"]["toolchain"],
              "parts": [p["name"] for p in params["target"]["parts"]] if len(parts) > 1 else None,
              "runner": "qnn-net-run --retrieve_context (HTP backend) on the phone"
              + (f", {len(parts)} parts in order" if len(parts) > 1 else ""),
              "samples": metrics["samples"], "summary": summary, "gates": params["gates"], "gated": gated,
              "passed": passed, "metrics": metrics, "key": key}
    atomic_write_json(result_path, record)
    print(f"{params['name']}: " + ", ".join(f"{k} {v:.6g}" for k, v in summary.items() if isinstance(v, float))
          + f" -> {result_path}", flush=True)
    shown = metrics.get("repeats") or {}
    if shown.get("repeats") is False:  # a verdict on one run would be chance
        raise BuildError(f"{params['name']}: the binary does not repeat itself on {phone.adb.name} ({phone.product}, "
                         f"runtime {identity['version']}): {repeats.describe(shown)}; its numbers are the worst of "
                         "the two runs, so the check fails (docs/device.md, \"Does the phone repeat itself\")")
    gates.judge(params["name"], params["gates"], summary, metrics.get("float_score"))  # raises on a missed gate
    return record

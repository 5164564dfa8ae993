"""device_check:<model>/<graph>/<variant>@<device>: the chip's context binary on the phone's NPU over the graph's
evaluation inputs, judged with the graph's gates exactly as the check stage judges the emulator (check.measure,
check.summarize, gates.results/judge: one judgement).

Inputs are the evaluation set verify saved (.evaluation.npz), written as float32 raw files in the binary's input
order with an input_list.txt of `<tensor>:=<path>` lines (qnn-net-run quantizes float inputs with the binary's
encodings and writes float outputs, Result_<n>/<tensor>.raw); outputs are read back through the I/O contract of the
binary's <graph>_ctx.onnx (names, shapes). The result file <graph>.device.<device>.json beside the binary records
chip, phone model, build fingerprint, runtime, binary digest, quantization and the numbers, keyed on the binary,
the runtime's identity, the phone's fingerprint, the evaluation set and the hooks: the same key judges the saved
numbers again without running the phone. It is written only when the phone run finished; a failed run removes an
older result, so no file claims what was not measured.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from ..errors import BuildError
from ..files import atomic_write_json, remove_quietly
from .errors import DeviceError
from .push import sha256
from .session import net_run, open_phone, push_runtime_and, remote_binary, remote_inputs, runtime_identity

VERSION = 1


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
    return {"version": VERSION, "binary": sha256(params["binary"]), "runtime": runtime,
            "fingerprint": phone.fingerprint, "evaluation": sha256(params["evaluation"]),
            "hooks": hooks_digest(params["hooks"]), "gates": params["gates"]}


def write_inputs(params: dict, contract: dict, folder: Path, remote: str) -> tuple[dict, list, list]:
    """float32 raw files + input_list.txt for the phone; returns (remote path -> local file, inputs, reference)."""
    import numpy as np

    from ..samples import load_evaluation
    inputs, reference = load_evaluation(params["evaluation"])
    files, lines = {}, []
    for i, sample in enumerate(inputs):
        entries = []
        for tensor in contract["inputs"]:
            if tensor["name"] not in sample:
                raise BuildError(f"{params['name']}: {params['evaluation']} has no input '{tensor['name']}' "
                                 "(the binary's I/O contract names it): run `doit verify` again")
            name = f"{i:04d}.{_safe(tensor['name'])}.raw"
            path = folder / name
            np.ascontiguousarray(sample[tensor["name"]].astype(np.float32)).tofile(path)
            files[f"{remote}/{name}"] = path
            entries.append(f"{tensor['qnn_name']}:={remote}/{name}")
        lines.append(" ".join(entries))
    listing = folder / "input_list.txt"
    listing.write_text("\n".join(lines) + "\n")
    files[f"{remote}/input_list.txt"] = listing
    return files, inputs, reference


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def read_outputs(params: dict, contract: dict, folder: Path, count: int) -> list[dict]:
    import numpy as np
    outputs = []
    for i in range(count):
        result = {}
        for tensor in contract["outputs"]:
            path = folder / f"Result_{i}" / f"{tensor['qnn_name']}.raw"
            if not path.is_file():
                raise DeviceError(f"{params['name']}: qnn-net-run on the phone wrote no Result_{i}/"
                                  f"{tensor['qnn_name']}.raw (output '{tensor['name']}')")
            data = np.fromfile(path, dtype=np.float32)
            size = int(np.prod(tensor["shape"]))
            if data.size != size:
                raise DeviceError(f"{params['name']}: Result_{i}/{tensor['qnn_name']}.raw holds {data.size} float32 "
                                  f"values, output '{tensor['name']}' has shape {tensor['shape']}")
            result[tensor["name"]] = data.reshape(tensor["shape"])
        outputs.append(result)
    return outputs


def check(params: dict) -> dict:
    from .. import dist, gates
    from ..stages import check as check_stage
    from ..samples import load_labels

    result_path = Path(params["outputs"]["result"])
    phone = open_phone(params)
    try:
        saved = json.loads(result_path.read_text())
    except (OSError, ValueError):
        saved = None
    contract = dist.contract_from_ctx(params["ctx_model"])
    with tempfile.TemporaryDirectory(prefix="build-rules-device-") as tmp:
        tmp = Path(tmp)
        (tmp / "inputs").mkdir()
        inputs_remote = remote_inputs(params)
        input_files, inputs, reference = write_inputs(params, contract, tmp / "inputs", inputs_remote)
        binary_remote = remote_binary(params)
        pushed = push_runtime_and(phone, {binary_remote: params["binary"], **input_files})
        identity = runtime_identity(phone, pushed)
        key = _key(params, phone, identity)
        if saved and saved.get("key") == key:
            print(f"{result_path}: measured on {phone.adb.name} from the same binary, runtime, phone build, "
                  "evaluation set and hooks: judged again, not run again", flush=True)
            metrics = saved["metrics"]
        else:
            remove_quietly(result_path)  # a result of another binary/runtime/phone build is stale from here on
            output_remote = binary_remote.replace("/bin/", "/outputs/", 1)[:-len(".bin")]
            print(f"{phone.adb.name}: qnn-net-run over {len(inputs)} evaluation input(s)", flush=True)
            phone.adb.shell(net_run(binary_remote, f"{inputs_remote}/input_list.txt", output_remote))
            phone.adb.pull(output_remote, tmp / "pulled")
            outputs = read_outputs(params, contract, tmp / "pulled", len(inputs))
            metrics = check_stage.measure(params["hooks"], params["graph"], params.get("data_dir"), inputs,
                                          reference, outputs, load_labels(params["evaluation"]))
    summary = check_stage.summarize(metrics)
    gated = gates.results(params["gates"], summary, metrics.get("float_score"))
    passed = gates.passes_all(params["gates"], summary, metrics.get("float_score"))
    record = {"chip": params["chip"]["name"], "device": params["device"]["name"], "serial": params["device"]["serial"],
              "phone_model": phone.product, "fingerprint": phone.fingerprint, "soc": phone.soc,
              "runtime": {"version": identity["version"], "build_id": identity["build_id"]},
              "binary_sha256": key["binary"], "variant": params["variant"], "quantization": params["quantization"],
              "runner": "qnn-net-run --retrieve_context (HTP backend) on the phone",
              "samples": metrics["samples"], "summary": summary, "gates": params["gates"], "gated": gated,
              "passed": passed, "metrics": metrics, "key": key}
    atomic_write_json(result_path, record)
    print(f"{params['name']}: " + ", ".join(f"{k} {v:.6g}" for k, v in summary.items() if isinstance(v, float))
          + f" -> {result_path}", flush=True)
    gates.judge(params["name"], params["gates"], summary, metrics.get("float_score"))  # raises on a missed gate
    return record

"""One graph on the phone: its parts in order (target.py), each pushed with its inputs, run by qnn-net-run and its
outputs pulled; a tensor crossing a cut is handed from one part's outputs to a later part's inputs on the host.
device_check judges the final outputs; profile passes its profiling flags to every part and reads each part's log.

Remote layout (under REMOTE_ROOT): bin/<model>/<variant>/<chip>/<part>.bin; the first part's inputs (the evaluation
set's) in inputs/<model>/<graph>/, a later part's (the earlier parts' outputs on this phone) in
inputs/<model>/<variant>/<chip>/<part>/; native inputs (profile: the binary's own types) in
inputs/<model>/<variant>/<chip>/<part>/native/; outputs in <kind>/<model>/<variant>/<chip>/<part>/.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from .adb import run_seconds
from .devices import REMOTE_ROOT
from .errors import DeviceError
from .session import missing_library_hint, net_run, push_runtime_and
from .target import Part, read_outputs, write_inputs


@dataclass
class PartRun:
    part: Part
    binary: str  # remote
    input_list: str  # remote
    output_dir: str  # remote
    pulled: Path  # local copy of output_dir
    pushed: dict  # push_missing's answer (digests of the runtime and of what this part needed)
    said: str = ""  # what qnn-net-run (and its wrapper) printed


def remote_binary(params: dict, part: str) -> str:
    return f"{REMOTE_ROOT}/bin/{params['model']}/{params['variant']}/{params['chip']['name']}/{part}.bin"


def remote_inputs(params: dict, graph: str, index: int, part: str, native: bool = False) -> str:
    if native:  # quantized with this variant's encodings
        return f"{REMOTE_ROOT}/inputs/{params['model']}/{params['variant']}/{params['chip']['name']}/{part}/native"
    if index == 0:
        return f"{REMOTE_ROOT}/inputs/{params['model']}/{graph}"
    return f"{REMOTE_ROOT}/inputs/{params['model']}/{params['variant']}/{params['chip']['name']}/{part}"


def run_graph(phone, params: dict, graph: str, parts: list[Part], samples: list[dict], tmp: Path, kind: str,
              extra: tuple = (), shapes: dict | None = None, before=None,
              final_outputs: bool = True, native: bool = False, more_files: dict | None = None,
              around=None, wrapper: str = "") -> tuple[list[dict], list[PartRun]]:
    """The parts in order over the samples (feeds in ONNX layout). Returns the graph's outputs per sample (every
    part's outputs that no later part reads) and each part's run. before(runs so far) may stop before a part runs
    (device_check's saved result) by returning False. With `extra` flags that repeat inferences (profile), every
    part but the last keeps one output per sample (--keep_num_outputs), the ones a later part reads; without
    final_outputs the last part keeps one and nothing of it is read. `native`: inputs and outputs in the binary's
    own types (--use_native_input_files / --use_native_output_files); more_files: more to push (remote -> local);
    around(part run): a context manager around each part's qnn-net-run (profile reads the thermal state there);
    wrapper: the program that runs qnn-net-run (session.net_run)."""
    available = [dict(s) for s in samples]
    later = [{t.name for p in parts[k + 1:] for t in p.inputs} for k in range(len(parts))]
    final = [{} for _ in samples]
    runs = []
    for k, part in enumerate(parts):
        folder = tmp / part.name
        inputs_remote = remote_inputs(params, graph, k, part.name, native)
        files = write_inputs(params["name"], part, available, folder / "inputs", inputs_remote, native)
        binary = remote_binary(params, part.name)
        pushed = push_runtime_and(phone, {binary: part.binary, **files, **(more_files or {})})
        output_dir = f"{REMOTE_ROOT}/{kind}/{params['model']}/{params['variant']}/{params['chip']['name']}/{part.name}"
        run = PartRun(part, binary, f"{inputs_remote}/input_list.txt", output_dir, folder / "pulled", pushed)
        runs.append(run)
        if before is not None and before(runs) is False:
            return [], runs
        print(f"{phone.adb.name}: {part.name}: qnn-net-run over {len(samples)} input(s)", flush=True)
        last = k == len(parts) - 1
        keep = () if not extra else ("--keep_num_outputs", "1" if last and not final_outputs else str(len(samples)))
        io = ("--use_native_input_files", "--use_native_output_files") if native else ()
        with around(run) if around else contextlib.nullcontext():
            try:
                run.said = phone.adb.shell(net_run(binary, run.input_list, output_dir, *extra, *io, *keep,
                                                   wrapper=wrapper), timeout=run_seconds())
            except DeviceError as e:
                raise DeviceError(f"{e}{missing_library_hint(str(e), phone)}") from None
        phone.adb.pull(output_dir, run.pulled)
        if last and not final_outputs:
            break
        outputs = read_outputs(params["name"], part, run.pulled, len(samples), shapes, native)
        for i, values in enumerate(outputs):
            available[i].update(values)
            final[i].update({n: v for n, v in values.items() if n not in later[k]})
    return final, runs

"""The device tasks' generators (issue 29; none is a default task): device_check, profile and power per phone named
in devices.toml. Loading reads devices.toml only (TOML): `doit list` never calls adb; the actions do (device/).

  device_check:<model>/<graph>/<variant>@<device>   the binary on the phone's NPU, judged by the graph's gates
  profile:<model>/<variant>@<device>                load, first and steady-state latency, qnn-profile-viewer
  power:<model>/<variant>@<device>                  NPU then CPU loops: CPU share and battery drain
A phone gets the tasks of the variants built for its chip (devices.toml soc = a chips.toml chip), under either
toolchain (ort-qnn: the <graph>_ctx.onnx contract; qairt: _net.json / info.json); a split graph's parts run in order. The tasks run in doit's process: they wait on adb, and
power's Ctrl-C handling must restore the phone's battery state itself.
The tasks declare no doit targets on purpose: the report and dist tasks list the result files as file_dep (a new
result re-makes them), and doit would otherwise run the phone tasks whose targets they are before every
`doit report` / `doit dist`. The actions write their results atomically themselves; each task's last action turns
its result into the build summary's line for it (device/console.py), since doit keeps in-process prints to itself.
"""
from __future__ import annotations

import os

from ..build_state import layout
from ..configuration.config import gate_dicts
from ..device.settings import POWER_SECONDS_ENV, power_sample_seconds, power_seconds, profile_runs
from ..doit_run.project import chip_params, hook_files, model_data, project, rel, variant_builds

def devices() -> dict:
    """The phones devices.toml names well; a phone with a mistake gets no tasks (its line: device_file().problems)."""
    from ..device.named import device_file
    return device_file().found


def _device_params(device) -> dict:
    return {"name": device.name, "serial": device.serial, "soc": device.soc, "model": device.model}


def _common(device, chip) -> dict:
    """What every device task's action needs about the phone, the chip and what compiled its binaries (the
    toolchain's identity: the runtime pushed must be as new, device/runtime.check_loads)."""
    return {"chip": chip_params(chip), "chips": list(project().chips.chips), "device": _device_params(device),
            "toolchain": project().toolchain}


def _builds_on(device):
    for model in project().models:
        for variant, chip in variant_builds(model):
            if chip.name == device.soc:
                yield model, variant, chip


def _target(model, graph, variant, chip) -> dict:
    """What runs on the phone for one graph (device/target.py): its parts' binaries and I/O contracts, in order."""
    def chip_file(name):
        return layout.chip_file(model.name, variant.name, chip.name, name)
    specs = {name: {"shape": list(s.shape), "dtype": s.dtype, "layout": s.layout} for name, s in graph.inputs.items()}
    if project().toolchain["name"] == "qairt":  # the qairt toolchain compiles every graph whole
        from . import qairt as qairt_tasks
        return {"toolchain": "qairt", "flow": qairt_tasks.flow(), "inputs": qairt_tasks.input_specs(graph),
                "outputs": list(graph.outputs),
                "parts": [{"name": graph.name, "binary": chip_file(f"{graph.name}.bin"),
                           "contract": qairt_tasks.io_contract(model.name, variant.name, chip.name, graph.name)}]}
    from .split import units
    return {"toolchain": "ort-qnn", "flow": None, "inputs": specs, "outputs": list(graph.outputs),
            "parts": [{"name": u, "binary": chip_file(f"{u}.bin"), "contract": chip_file(f"{u}_ctx.onnx")}
                      for u in units(model, graph)]}


def _target_files(target: dict) -> list[str]:
    return [f for part in target["parts"] for f in (part["binary"], part["contract"])]


def device_check_tasks():
    if not devices():
        return
    from ..device import console, device_check
    from ..device.devices import check_result
    for device in devices().values():
        for model, variant, chip in _builds_on(device):
            data_params, data_dep = model_data(model)
            for graph in model.graphs.values():
                target = _target(model, graph, variant, chip)
                evaluation = layout.float_file(model.name, graph.name, ".evaluation.npz")
                result = check_result(model.name, variant.name, chip.name, graph.name, device.name)
                name = f"{model.name}/{graph.name}/{variant.name}@{device.name}"
                params = {"name": f"device_check:{name}", "model": model.name, "graph": graph.name,
                          "variant": variant.name, "quantization": variant.settings(), **_common(device, chip),
                          "target": target,
                          "evaluation": evaluation, "hooks": rel(model.hooks), "gates": gate_dicts(graph.gates),
                          "outputs": {"result": result}, **data_params}
                yield {"name": name,
                       "actions": [(device_check.run, [params]), (console.action, ["device_check", params])],
                       "file_dep": [*_target_files(target), evaluation, *hook_files(model), *data_dep],
                       "uptodate": [False],  # the action keys on the phone's build fingerprint, which needs adb
                       "doc": f"{graph.name} of {model.name}/{variant.name} on {device.name} ({device.soc}) "
                              "vs the float model, by the graph's gates"}


def profile_tasks():
    if not devices():
        return
    from ..device import console, profile
    from ..device.devices import profile_result
    runs = profile_runs()
    for device in devices().values():
        for model, variant, chip in _builds_on(device):
            graphs = {g.name: {"target": _target(model, g, variant, chip),
                               "evaluation": layout.float_file(model.name, g.name, ".evaluation.npz"),
                               "float_model": layout.float_file(model.name, g.name, ".sim.onnx")}  # CPU baseline
                      for g in model.graphs.values()}
            result = profile_result(model.name, variant.name, chip.name, device.name)
            name = f"{model.name}/{variant.name}@{device.name}"
            params = {"name": f"profile:{name}", "model": model.name, "variant": variant.name,
                      **_common(device, chip), "graphs": graphs, "runs": runs, "warmup": 3,
                      "perf_profile": os.environ.get("BUILD_RULES_PERF_PROFILE", "burst"),
                      "profiling_level": os.environ.get("BUILD_RULES_PROFILING_LEVEL", "basic"),
                      # the real-time factor's audio duration and graph runs (device/realtime.py)
                      "float_evaluation": layout.float_file(model.name, "model", ".evaluate.json")
                      if model.evaluate else None,
                      "outputs": {"result": result}}
            file_dep = [f for g in graphs.values()
                        for f in (*_target_files(g["target"]), g["evaluation"], g["float_model"])]
            yield {"name": name, "actions": [(profile.run, [params]), (console.action, ["profile", params])],
                   "file_dep": file_dep + ([params["float_evaluation"]] if model.evaluate else []),
                   "uptodate": [False], "doc": f"{model.name}/{variant.name} latency on {device.name} (NPU vs CPU)"}


def power_tasks():
    if not devices():
        return
    from ..device import console, power
    from ..device.devices import power_result
    asked = os.environ.get(POWER_SECONDS_ENV, "").strip()
    seconds = power_seconds()
    seconds_from = f"{POWER_SECONDS_ENV}={asked}" if asked else f"the default; {POWER_SECONDS_ENV} sets it"
    for device in devices().values():
        for model, variant, chip in _builds_on(device):
            # the first graph that is one binary (a split graph's parts would loop as several processes)
            targets = ((g, _target(model, g, variant, chip)) for g in model.graphs.values())
            graph, target = next(((g, t) for g, t in targets if len(t["parts"]) == 1), (None, None))
            if graph is None:
                continue
            result = power_result(model.name, variant.name, chip.name, device.name)
            name = f"{model.name}/{variant.name}@{device.name}"
            params = {"name": f"power:{name}", "model": model.name, "variant": variant.name, "graph": graph.name,
                      **_common(device, chip), "target": target,
                      "evaluation": layout.float_file(model.name, graph.name, ".evaluation.npz"),
                      "float_model": layout.float_file(model.name, graph.name, ".sim.onnx"),  # the CPU path
                      "seconds": seconds, "seconds_from": seconds_from, "sample_seconds": power_sample_seconds(),
                      "outputs": {"result": result}}
            yield {"name": name, "actions": [(power.run, [params]), (console.action, ["power", params])],
                   "file_dep": [*_target_files(target), params["evaluation"], params["float_model"]],
                   "uptodate": [False], "doc": f"{model.name}/{variant.name} on {device.name}: battery drain and CPU "
                                               f"share over {seconds:g} s per path ({POWER_SECONDS_ENV})"}

"""The hooks table of docs/model-toml.md, row by row: a model whose hooks record what they get (argument types, the stage
calling them, whether DATA_DIR and CHECKPOINTS are set) is built once, and each row must say exactly that.

Two models: the tiny net's head graph alone with a data stage, evaluation_inputs, score and evaluate (every stage
that calls a hook, on one chip and the fp16 variant, so nothing quantizes), and an ONNX-only graph with a
transform hook, no evaluation_inputs (verify then asks calibration_inputs) and the per-sample evaluate form. report, sensitivity and tune call score through the
same function as check and are not run here: they measure on the emulator for minutes.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from conftest import ROOT, TEST_MODELS, make_repo, run_doit, write_tinynet_checkpoints

RECORDING = '''

import json as _json
import sys as _sys
from pathlib import Path as _Path, PurePath as _PurePath


def _describe(value):
    """A value's type in the hooks table's notation: str, int, Path, ndarray, dict[K, V], list[T], onnx.ModelProto."""
    if isinstance(value, bool):
        return "bool"
    for kind, name in ((_PurePath, "Path"), (np.ndarray, "ndarray"), (str, "str"), (int, "int"), (float, "float")):
        if isinstance(value, kind):
            return name
    if isinstance(value, dict):
        keys = "|".join(sorted({_describe(k) for k in value}))
        values = "|".join(sorted({_describe(v) for v in value.values()}))
        return f"dict[{keys}, {values}]"
    if isinstance(value, list):
        return f"list[{'|'.join(sorted({_describe(v) for v in value}))}]"
    if type(value).__name__ == "ModelProto":
        return "onnx.ModelProto"
    return "callable" if callable(value) else type(value).__name__


def _record(hook, extra=None, **arguments):
    entry = {"model": MODEL, "hook": hook, "stage": _sys.argv[1],
             "arguments": {name: _describe(value) for name, value in arguments.items()},
             "DATA_DIR": str(globals()["DATA_DIR"]) if "DATA_DIR" in globals() else None,
             "CHECKPOINTS": sorted(globals()["CHECKPOINTS"]) if "CHECKPOINTS" in globals() else None, **(extra or {})}
    with open(_Path.cwd() / "hook_calls.jsonl", "a") as f:  # stages run in the repo's folder
        f.write(_json.dumps(entry) + "\\n")
'''

PYTORCH_HOOKS = RECORDING + '''
MODEL = "pytorch"
_build, _calibration_inputs = build, calibration_inputs


def build(graph, checkpoints):
    _record("build", graph=graph, checkpoints=checkpoints)
    return _build(graph, checkpoints)


def calibration_inputs(graph, count):
    _record("calibration_inputs", graph=graph, count=count)
    return _calibration_inputs(graph, count)


def prepare_data(out_dir, sources):
    _record("prepare_data", out_dir=out_dir, sources=sources)
    for seed in [int(x) for x in sources["seeds.txt"].read_text().split()]:
        rng = np.random.default_rng(seed)
        np.save(out_dir / f"features_{seed}.npy", rng.standard_normal((1, 64)).astype(np.float32))


def _features():
    return [{"features": np.load(p)} for p in sorted(_Path(DATA_DIR).glob("features_*.npy"))]


def evaluation_inputs(graph):
    _record("evaluation_inputs", graph=graph)
    return _features()


def score(graph, inputs, outputs):
    _record("score", graph=graph, inputs=inputs, outputs=outputs)
    return {"mean_output": float(np.mean([o[next(iter(o))].mean() for o in outputs]))}


def evaluate(run_graph):
    outputs = run_graph("head", _features()[0])
    _record("evaluate", {"run_graph returns": _describe(outputs)}, run_graph=run_graph)
    return {"top": float(np.argmax(outputs["logits"]))}
'''

ONNX_HOOKS = '''import numpy as np
''' + RECORDING + '''
MODEL = "onnx"


def calibration_inputs(graph, count):
    _record("calibration_inputs", graph=graph, count=count)
    rng = np.random.default_rng(1)
    return [{"x": rng.standard_normal((1, 4)).astype(np.float32)} for _ in range(count)]


def transform(model):
    _record("transform", model=model)
    model.graph.node[0].name = "patched"
    return model


def evaluation_samples():
    _record("evaluation_samples")
    return [1, 2]


def evaluate_sample(run_graph, sample):
    outputs = run_graph("net", {"x": np.full((1, 4), sample, np.float32)})
    _record("evaluate_sample", run_graph=run_graph, sample=sample)
    return {"y": float(outputs["y"].sum())}


def bound(results, total):
    _record("bound", results=results, total=total)
    return {"total": (None, None)}  # a sum of anything: nothing bounds it


def combine(results):
    _record("combine", results=results)
    return {"total": sum(r["y"] for r in results)}
'''

RUN = {"pytorch": ("data", "calibrate:tinynet/head", "check:tinynet/head/fp16@SM8750", "evaluate:tinynet/float"),
       "onnx": ("verify:det/net", "evaluate:det/float", "evaluate:det/fp16@SM8750")}  # (bound: on the emulator)
STAGES_RUN = {"data", "export", "simplify", "verify", "calibrate", "check", "evaluate"}


def _onnx_file(path: Path) -> None:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    weight = numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(4, 2) / 8, "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.fixture(scope="module")
def hook_calls(tmp_path_factory) -> list[dict]:
    calls = []
    pytorch = make_repo(tmp_path_factory.mktemp("hooks-pytorch"), {"tinynet": TEST_MODELS / "tinynet"})
    folder = pytorch / "models/tinynet"
    write_tinynet_checkpoints(folder)
    (folder / "seeds.txt").write_text("3 4\n")
    (folder / "hooks.py").write_text((folder / "hooks.py").read_text() + PYTORCH_HOOKS)
    toml = folder / "model.toml"
    text = toml.read_text()
    text = text[:text.index("[graphs.encoder]")] + text[text.index("[graphs.head]"):]  # one graph: fewer tasks
    toml.write_text(text.replace('chips = ["SM8550", "SM8750"]', 'chips = ["SM8750"]\ndata = ["seeds.txt"]')
                    + '\n[evaluate]\ngate = { metric = "top", min = 0 }\n')
    onnx_folder = tmp_path_factory.mktemp("hooks-onnx-src") / "det"
    onnx_folder.mkdir()
    _onnx_file(onnx_folder / "net.onnx")
    (onnx_folder / "hooks.py").write_text(ONNX_HOOKS)
    (onnx_folder / "model.toml").write_text('[model]\nonnx = "net.onnx"\nhooks = "hooks.py"\nchips = ["SM8750"]\n'
                                            '[graphs.net]\ninputs = { x = { shape = [1, 4], dtype = "float32" } }\n'
                                            '[variants.fp16]\nprecision = "fp16"\n'
                                            '[evaluate]\ngate = { metric = "total", min = -1000 }\n')
    onnx_repo = make_repo(tmp_path_factory.mktemp("hooks-onnx"), {"det": onnx_folder})
    # one emulator worker: the per-sample hooks run in the stage's own process, which _record names (a worker
    # process is not a stage)
    workers = os.environ.get("BUILD_RULES_EMULATOR_WORKERS")
    os.environ["BUILD_RULES_EMULATOR_WORKERS"] = "1"
    try:
        for repo, name in ((pytorch, "pytorch"), (onnx_repo, "onnx")):
            result = run_doit(repo, *RUN[name])
            assert result.code == 0, result.output
            calls += [json.loads(line) for line in (repo / "hook_calls.jsonl").read_text().splitlines()]
    finally:
        if workers is None:
            os.environ.pop("BUILD_RULES_EMULATOR_WORKERS")
        else:
            os.environ["BUILD_RULES_EMULATOR_WORKERS"] = workers
    return calls


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split(" | ")]


def hook_rows() -> list[dict]:
    """The rows of docs/model-toml.md's hooks table: name, argument types, stages, and where each global is set."""
    text = (ROOT / "docs/model-toml.md").read_text()
    lines = text[text.index("| hook, with the types it gets |"):].splitlines()
    rows = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        signature, called_by, data_dir, checkpoints = _cells(line)
        found = re.match(r"`(\w+)\((.*)\) -> (.+?)`", signature)
        assert found, signature
        arguments = dict(a.split(": ", 1) for a in re.split(r", (?=\w+: )", found.group(2))) if found.group(2) else {}

        def stages(cell):
            from build_rules.stage_table import BY_NAME
            return {s for s in re.findall(r"`(\w+)`", cell) if s in BY_NAME}
        rows.append({"hook": found.group(1), "arguments": arguments, "stages": stages(called_by),
                     "DATA_DIR": stages(data_dir), "CHECKPOINTS": stages(checkpoints), "called_by": called_by})
    return rows


ROWS = hook_rows()


def test_the_table_has_a_row_for_every_hook_the_stages_call():
    names = [row["hook"] for row in ROWS]
    assert names == ["prepare_data", "build", "calibration_inputs", "evaluation_inputs", "score", "evaluate",
                     "evaluation_samples", "evaluate_sample", "bound", "combine", "transform"]
    # the workers, and samples.py, where they load the hooks and call build, transform and score
    stage_sources = "".join(p.read_text() for p in [*(ROOT / "build_rules/stages").rglob("*.py"),
                                                     ROOT / "build_rules/measuring/samples.py"])
    called = set(re.findall(r"hooks\.(\w+)\(", stage_sources))
    assert called == set(names), "a hook the stages call is missing from docs/model-toml.md's table, or one is extra"


@pytest.mark.slow
@pytest.mark.parametrize("row", ROWS, ids=[row["hook"] for row in ROWS])
def test_each_hook_gets_what_its_row_says(hook_calls, row):
    calls = [c for c in hook_calls if c["hook"] == row["hook"]]
    assert calls, f"{row['hook']} was never called"
    for call in calls:  # "object": whatever the model's own hooks make of it (evaluate_sample's sample)
        assert call["arguments"] == {name: call["arguments"][name] if kind == "object" else kind
                                     for name, kind in row["arguments"].items()}, call
    observed = {c["stage"] for c in calls}
    assert observed <= row["stages"], f"called in {observed - row['stages']}, which the row does not name"
    assert row["stages"] & STAGES_RUN <= observed, f"not called in {(row['stages'] & STAGES_RUN) - observed}"
    for call in calls:
        if call["model"] == "pytorch":  # has data and checkpoints: each global is set exactly where the row says
            assert (call["DATA_DIR"] is not None) == (call["stage"] in row["DATA_DIR"]), call
            assert (call["CHECKPOINTS"] is not None) == (call["stage"] in row["CHECKPOINTS"]), call
        else:  # no data, no checkpoints: neither is ever set
            assert call["DATA_DIR"] is None and call["CHECKPOINTS"] is None, call
        if call["DATA_DIR"] is not None:
            assert Path(call["DATA_DIR"]).is_absolute() and call["DATA_DIR"].endswith("out/tinynet/data")
        if call["CHECKPOINTS"] is not None:
            assert call["CHECKPOINTS"] == ["head.pt"]
    if row["hook"] == "score":  # twice per binary: the float model's outputs, then the binary's
        assert len([c for c in calls if c["stage"] == "check"]) == 2
    if row["hook"] == "evaluate":  # run_graph's own signature, as the row writes it
        documented = re.search(r"`run_graph\(graph: str, feed: dict\[str, ndarray\]\) -> (.+?)`", row["called_by"])
        assert documented and {c["run_graph returns"] for c in calls} == {documented.group(1)}
    if row["hook"] == "calibration_inputs":  # verify asks for 8 when there is no evaluation_inputs
        assert {c["stage"] for c in calls if c["model"] == "onnx"} == {"verify"}

"""Step graphs: a graph whose outputs feed its own inputs at the next call (a decoder step with a KV cache, a
recurrent cell). model.toml declares it (`state`, `cache`, `greedy` under [graphs.<g>]); the config and simplify
check it against the graph's I/O; quantize gives each state output the scale and offset of the input it feeds, so
an app copies the fixed-point buffer over; the bundle's index describes the contract and `verify` runs greedy
steps through the bare binary with the state fed back in fixed point. Test model: tests/models/kvstep (one
attention layer over an 8-position cache); Whisper's decoder (tests/test_whisper.py) is the real one.
"""
from __future__ import annotations

import json
import runpy
import shutil
from pathlib import Path

import pytest

from conftest import TEST_MODELS, make_repo, run_doit


def kvstep_repo(dest: Path) -> Path:
    import torch
    repo = make_repo(dest, {"kvstep": TEST_MODELS / "kvstep"})
    folder = repo / "models/kvstep"
    torch.manual_seed(0)
    torch.save(runpy.run_path(str(folder / "hooks.py"))["module_class"]()().state_dict(), folder / "step.pt")
    return repo


@pytest.fixture(scope="module")
def kvstep_dist(tmp_path_factory):
    repo = kvstep_repo(tmp_path_factory.mktemp("kvstep"))
    result = run_doit(repo, "dist")
    assert result.code == 0, result.output
    return repo, result


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new))


@pytest.mark.slow
def test_the_bundle_index_describes_the_step_contract(kvstep_dist):
    repo, _ = kvstep_dist
    index = json.loads((repo / "out/kvstep/dist/w8a16/index.json").read_text())
    entry = index["graphs"]["step"]
    inputs = {t["name"]: t for t in entry["io"]["inputs"]}
    outputs = {t["name"]: t for t in entry["io"]["outputs"]}
    step = entry["step"]
    assert [(s["output"], s["input"], s["same_encoding"]) for s in step["state"]] == \
        [("this_k", "k_cache", True), ("this_v", "v_cache", True)]
    for output, target in (("this_k", "k_cache"), ("this_v", "v_cache")):
        # quantize tied the output to the input it feeds: the app copies the uint16 buffer into the cache
        assert inputs[target]["dtype"] == outputs[output]["dtype"] == "UFIXED_POINT_16"
        assert (inputs[target]["scale"], inputs[target]["offset"]) == (outputs[output]["scale"], outputs[output]["offset"])
        assert inputs[target]["shape"] == [1, step["cache"]["length"], 16] and outputs[output]["shape"] == [1, 1, 16]
    assert step["cache"] == {"length": 8, "axis": 1, "offset": "offset", "mask": "mask",
                             "mask_values": {"not_written": 1, "written": 0}}
    assert (inputs["offset"]["dtype"], inputs["offset"]["shape"]) == ("INT_32", [1])
    assert (inputs["mask"]["dtype"], inputs["mask"]["shape"]) == ("INT_32", [8])
    assert step["greedy"] == {"logits": "logits", "token": "token"} and inputs["token"]["dtype"] == "INT_32"
    assert "write each state output into its input at index offset along axis 1" in step["how"]
    log = (repo / "out/kvstep/w8a16/dist.log").read_text()
    assert "SM8750/step: 3 greedy steps with the state fed back in the binary's own types agree with" in log


def test_verify_walks_greedy_steps_through_the_bare_binary(kvstep_dist, capsys):
    from build_rules import dist
    repo, _ = kvstep_dist
    assert dist.main(["verify", str(repo / "out/kvstep/dist/w8a16"), "--samples", "1", "--steps", "5"]) == 0
    printed = capsys.readouterr().out
    assert "SM8750/step: 5 greedy steps with the state fed back" in printed, printed


def test_an_untied_state_needs_converting_and_a_plain_copy_is_caught(kvstep_dist, tmp_path, monkeypatch):
    """Quantized without the tie, from caches 4 x what decoding holds, the cache inputs get 4 x the scale of the
    step's outputs: the contract says to convert, verify's greedy steps pass that way, and fail a bundle whose index
    says to copy the buffers as they are."""
    from build_rules import dist
    from build_rules.configuration import config
    from build_rules.measuring.samples import read_input_list
    from build_rules.toolchains import ort_qnn

    repo, _ = kvstep_dist
    monkeypatch.chdir(repo)  # input_list.txt names the raw files relative to the repo
    graph = config.load_model(repo / "models/kvstep", config.load_chips(repo / "chips.toml")).graphs["step"]
    float_dir = repo / "out/kvstep/float"
    specs = json.loads((float_dir / "step.io.json").read_text())["inputs"]
    samples = read_input_list(str(repo / "out/kvstep/calibration/step/input_list.txt"), {t["name"]: t for t in specs})
    for sample in samples:
        sample["k_cache"], sample["v_cache"] = 4 * sample["k_cache"], 4 * sample["v_cache"]
    ort_qnn.quantize(float_dir / "step.sim.onnx", tmp_path / "step.qdq.onnx", samples, activations="uint16",
                     weights="uint8", per_channel=False)
    ort_qnn.compile_context_binary(tmp_path / "step.qdq.onnx", tmp_path / "SM8750", "step", soc_model=69, vtcm_mb=8,
                                   fp16=False)
    contract = dist.contract_from_ctx(tmp_path / "SM8750/step_ctx.onnx")
    contract = {"inputs": contract["inputs"], "outputs": contract["outputs"]}
    entry = {"io": contract, "step": dist.step_entry(graph.step_contract(), contract, {})}
    assert [(s["same_encoding"], s["write"].split(":")[0]) for s in entry["step"]["state"]] == [(False, "convert")] * 2
    evaluation = float_dir / "step.evaluation.npz"
    assert dist.check_steps(tmp_path / "SM8750", "step", entry, evaluation, 3, "untied")["steps"] == 3
    for link in entry["step"]["state"]:
        link["same_encoding"] = True  # an index telling the app to copy the buffers over as they are
    with pytest.raises(dist.DistError, match=r"untied: greedy step 1: output '\w+' of the bare binary, its state fed "
                                             r"back as the index's step.state says, differs from step_ctx.onnx"):
        dist.check_steps(tmp_path / "SM8750", "step", entry, evaluation, 3, "untied")


def test_a_split_step_graph_keeps_its_contract_and_verify_steps_through_the_chained_parts(kvstep_dist, tmp_path):
    """[graphs.step] split (issue 22) on a step graph: the parts are cut from the whole graph's QDQ model, so the
    state outputs keep the encodings of the cache inputs they feed; the index has the parts, the cut and the step
    contract over the chain's I/O, and verify's greedy steps run through the chained bare binaries."""
    repo = tmp_path / "repo"
    shutil.copytree(kvstep_dist[0], repo, symlinks=True)
    toml = repo / "models/kvstep/model.toml"
    edit(toml, 'greedy = { logits = "logits", token = "token" }\n',
         'greedy = { logits = "logits", token = "token" }\nsplit = { parts = 2 }\n')
    result = run_doit(repo, "dist:kvstep/w8a16")
    assert result.code == 0, result.output
    # the whole graph's export, calibration and QDQ model are reused: only the split and what follows it ran
    assert {name.split(":")[0] for name in result.ran} == {"split", "compile", "check", "package", "dist"}, result.ran
    entry = json.loads((repo / "out/kvstep/dist/w8a16/index.json").read_text())["graphs"]["step"]
    assert [p["name"] for p in entry["parts"]] == ["step.part1", "step.part2"] and len(entry["cuts"]) == 1
    inputs = {t["name"]: t for t in entry["io"]["inputs"]}
    outputs = {t["name"]: t for t in entry["io"]["outputs"]}
    assert set(inputs) == {"token", "k_cache", "v_cache", "offset", "mask"}
    assert set(outputs) == {"logits", "this_k", "this_v"}
    assert [(s["output"], s["input"], s["same_encoding"]) for s in entry["step"]["state"]] == \
        [("this_k", "k_cache", True), ("this_v", "v_cache", True)]
    for output, target in (("this_k", "k_cache"), ("this_v", "v_cache")):
        assert (inputs[target]["scale"], inputs[target]["offset"]) == (outputs[output]["scale"], outputs[output]["offset"])
    log = (repo / "out/kvstep/w8a16/dist.log").read_text()
    assert "SM8750/step: 2 parts chained through the bare binaries hold the I/O contract" in log, log
    assert ("SM8750/step: 3 greedy steps with the state fed back in the binary's own types agree with its parts' "
            "_ctx.onnx chained") in log, log


@pytest.mark.parametrize("old, new, message", [
    ('this_k = "k_cache"', 'this_q = "k_cache"',
     "[graphs.step.state] this_q: not an output of the graph (outputs: logits, this_k, this_v)"),
    ('this_v = "v_cache"', 'this_v = "k_cache"', "[graphs.step.state] this_v: input 'k_cache' is fed by two outputs"),
    ("length = 8,", "length = 9,",
     "[graphs.step.cache] length: 9, but state input 'k_cache' [1, 8, 16] has 8 positions along axis 1"),
    ('offset = { shape = [1], dtype = "int32" }', 'offset = { shape = [1], dtype = "float32" }',
     "[graphs.step.cache] offset: input 'offset' is float32[1]: it must be one int32 value, e.g. "
     'offset = { shape = [1], dtype = "int32" }'),
    ('mask = { shape = [8], dtype = "int32" }', 'mask = { shape = [1, 7], dtype = "int32" }',
     "[graphs.step.cache] mask: input 'mask' is int32[1, 7]: it must hold one int32 per cache position (8 values"),
    ('[graphs.step.state]\nthis_k = "k_cache"\nthis_v = "v_cache"\n', "",
     "[graphs.step] cache: only with `state` (which outputs feed which inputs at the next step)"),
])
def test_a_wrong_step_declaration_names_the_key(tmp_path, old, new, message):
    repo = make_repo(tmp_path / "repo", {"kvstep": TEST_MODELS / "kvstep"})
    (repo / "models/kvstep/step.pt").write_bytes(b"")
    edit(repo / "models/kvstep/model.toml", old, new)
    result = run_doit(repo, "list")
    assert result.code != 0
    assert f"models/kvstep/model.toml: {message}" in result.output, result.output


def test_a_state_output_that_does_not_fit_its_input_fails_at_simplify(kvstep_dist, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(kvstep_dist[0], repo, symlinks=True)
    toml = repo / "models/kvstep/model.toml"
    edit(toml, 'greedy = { logits = "logits", token = "token" }\n', "")
    edit(toml, 'this_k = "k_cache"', 'logits = "k_cache"')
    result = run_doit(repo, "simplify")
    assert result.code != 0
    assert result.ran == {"simplify:kvstep/step"}
    assert ("state output 'logits' is float32[1, 1, 32] but feeds input 'k_cache' float32[1, 8, 16], which needs "
            "one position of it along the cache axis 1: float32[1, 1, 16] (models/kvstep/model.toml "
            "[graphs.step] state)") in result.output, result.output


def test_the_index_entry_of_a_recurrent_state_and_of_inputs_other_graphs_feed():
    """Without a cache each state output replaces its input; an input that another graph's output of the same name
    feeds is named with that graph; a pair whose encodings differ is converted."""
    from build_rules import dist

    def tensor(name, dtype, scale=None, offset=None, shape=(1, 32)):
        return {"name": name, "qnn_name": name, "shape": list(shape), "dtype": dtype, "scale": scale,
                "offset": offset, "layout": None}

    contract = {"inputs": [tensor("frame", "UFIXED_POINT_16", 0.01, -100), tensor("h", "UFIXED_POINT_16", 0.002, -30),
                           tensor("memory", "UFIXED_POINT_16", 0.1, 0)],
                "outputs": [tensor("logits", "UFIXED_POINT_16", 0.5, -7), tensor("h_out", "UFIXED_POINT_16", 0.003, -30)]}
    step = {"state": {"h_out": "h"}, "cache": None, "greedy": None}
    entry = dist.step_entry(step, contract, {"memory": "encoder"})
    assert entry["state"] == [{"output": "h_out", "input": "h", "same_encoding": False,
                               "write": "convert: dequantize with the output's scale/offset, quantize with the input's"}]
    assert entry["cache"] is None and entry["inputs_from_graphs"] == {"memory": "encoder"}
    assert entry["how"] == ("per sequence: set every state input to 0.0 (in fixed point: q = -offset); per step: run, "
                            "then each state output replaces its input (as `write` says); 'memory' come once per "
                            "sequence from the output of the same name of graph encoder")
    with pytest.raises(dist.DistError, match=r"state h_next -> h: not in the binary's I/O contract"):
        dist.step_entry({"state": {"h_next": "h"}, "cache": None, "greedy": None}, contract, {})


@pytest.mark.slow
def test_tune_sets_a_state_pair_to_one_type_and_the_build_says_which_override_breaks_it(tmp_path, monkeypatch):
    """Whisper's decoder (bench/whisper_tune.py): tune proposed 'this_self_v_1' at 16 bit with the state input it
    feeds at 8, which quantize refused, and had measured the graph without the pair's shared encoding at all. Tune's
    candidates now quantize as the build does, with a 16-bit tensor next to a state pair taking the whole pair to 16
    bit (output, input and the tensors sharing their encoding); an override that would break a pair is an error that
    names it."""
    from build_rules.stages.support.precision import Candidates
    repo = kvstep_repo(tmp_path)
    toml = repo / "models/kvstep/model.toml"
    toml.write_text(toml.read_text() + '\n[variants.w8a8]\ninherits = "w8a16"\nactivations = "uint8"\n')
    assert run_doit(repo, "check:kvstep/step/w8a8@SM8750").code == 0
    out = repo / "out/kvstep"
    graph = {"name": "step", "onnx": str(out / "float/step.sim.onnx"),
             "ranges": str(out / "calibration/step/ranges.minmax-12.json"),
             "evaluation": str(out / "float/step.evaluation.npz"),
             "variant": {"activations": "uint8", "weights": "uint8"},
             "tied": [("this_k", "k_cache"), ("this_v", "v_cache")]}
    monkeypatch.chdir(repo)
    c = Candidates(graph, {"name": "SM8750", "soc_id": 69, "vtcm_mb": 8}, 4, "models/kvstep/hooks.py")
    # _v_64 feeds the Gemm that makes _v_327, which a Reshape passes on as this_k (one encoding with k_cache)
    assert c.closed({"_v_64"}) == {"_v_64", "_v_327", "this_k", "k_cache", "_v_333", "this_v", "v_cache"}
    assert c.closed({"softmax"}) == {"softmax"}  # touches no state pair
    import onnx
    from onnx import numpy_helper
    qdq = onnx.load(str(c.quantize({"_v_64"}, tmp_path / "candidate.onnx")))
    initializers = {i.name: i for i in qdq.graph.initializer}
    scales = {n.input[0].removesuffix("_QuantizeLinear_Input"):  # a graph output's Q reads it renamed so
              (float(numpy_helper.to_array(initializers[n.input[1]])), initializers[n.input[2]].data_type)
              for n in qdq.graph.node if n.op_type == "QuantizeLinear"}
    assert scales["k_cache"] == scales["this_k"] == scales["_v_327"] and scales["k_cache"][1] == onnx.TensorProto.UINT16
    assert c.measure({"_v_64"})["cosine"] > 0.9

    # The build: an override next to a state pair that leaves the pair at 8 bit names the pair and the fix
    toml.write_text(toml.read_text() + '\n[variants.w8a8_mixed]\ninherits = "w8a8"\n'
                    '[variants.w8a8_mixed.graphs.step]\noverrides = { "_v_64" = "uint16" }\n')
    result = run_doit(repo, "quantize:kvstep/step/w8a8_mixed")
    assert result.code != 0
    assert ("quantize:kvstep/step/w8a8_mixed: override '_v_64' = QUInt16 makes state tensor '_v_327' QUInt16 too (it "
            "is an output of a node next to '_v_64'), but the state pair 'this_k' -> 'k_cache' is QUInt8: set "
            "'this_k', '_v_327', 'k_cache' to QUInt16 as well, or leave '_v_64' at QUInt8") in result.output, result.output
    assert not (out / "w8a8_mixed/step.qdq.onnx").exists()
    # tune's closed set, as its proposal writes it, builds and passes the gate
    pairs = ", ".join(f'"{t}" = "uint16"' for t in sorted(c.closed({"_v_64"})))
    toml.write_text(toml.read_text().replace('overrides = { "_v_64" = "uint16" }', f"overrides = {{ {pairs} }}"))
    result = run_doit(repo, "check:kvstep/step/w8a8_mixed@SM8750")
    assert result.code == 0, result.output

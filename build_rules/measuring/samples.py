"""Helpers shared by stages: the model's hook file, raw calibration files, metrics."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

from ..errors import BuildError


def load_hooks(path: str, data_dir: str | None = None, checkpoints: list[str] | None = None):
    """Import models/<name>/export.py by path (model folders are not packages). A model with a data
    stage finds that stage's folder in the hooks module's DATA_DIR; CHECKPOINTS maps file name to path
    (what build() gets) for data hooks that run the model itself."""
    spec = importlib.util.spec_from_file_location(f"model_hooks_{Path(path).parent.name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    if data_dir is not None:
        module.DATA_DIR = Path(data_dir).resolve()
    if checkpoints:
        module.CHECKPOINTS = Checkpoints({Path(p).name: Path(p).resolve() for p in checkpoints})
    return module


class Checkpoints(dict):
    """What build(graph, checkpoints) gets: file name -> path, in model.toml's order. `checkpoints[0]` is the
    first one too (a graph with one checkpoint rarely cares about its name); an unknown name lists the known."""

    def __missing__(self, key):
        if isinstance(key, int) and not isinstance(key, bool) and -len(self) <= key < len(self):
            return list(self.values())[key]
        raise KeyError(f"no checkpoint {key!r}: the graph's checkpoints are {', '.join(self) or 'none'} "
                       "(file names from [model] / [graphs.<name>] checkpoints in model.toml)")


def build_module(hooks, params: dict):
    """The graph's torch module from the build hook, in eval mode; a failing hook is named with its checkpoints."""
    import torch
    guard_checkpoint_loading(params)
    # nn.TransformerEncoderLayer / MultiheadAttention take a fused "fast path" in eval mode without grad
    # (aten._transformer_encoder_layer_fwd): no exporter can write it, and with a float mask it returns NaN. Export
    # and verify run the plain ops the ONNX graph has.
    torch.backends.mha.set_fastpath_enabled(False)
    if not hasattr(hooks, "build"):
        raise BuildError(f"{params['hooks']}: no build(graph, checkpoints) hook (or set [model] onnx = ... "
                         f"in {params['model_toml']} for an ONNX-only model)")
    checkpoints = Checkpoints({Path(p).name: Path(p) for p in params["checkpoints"]})
    try:
        module = hooks.build(params["graph"], checkpoints)
    except BuildError:
        raise
    except Exception as e:  # a corrupt checkpoint surfaces here: name it
        hint = ""
        if "Weights only load failed" in str(e):  # a checkpoint of pickled objects, not plain tensors
            hint = (f" -- the checkpoint holds pickled Python objects; if you trust it, set trusted_checkpoints = true "
                    f"under [model] in {params['model_toml']} and load it with torch.load(path, weights_only=False)")
        raise BuildError(f"{params['hooks']}: build({params['graph']!r}) failed with checkpoints "
                         f"{', '.join(map(str, checkpoints.values())) or 'none'}: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}{hint}") from e
    if not isinstance(module, torch.nn.Module):
        raise BuildError(f"{params['hooks']}: build({params['graph']!r}) returned {type(module).__name__}, "
                         "expected a torch.nn.Module")
    return module.eval()


def transformed(hooks, model, hooks_path: str):
    """An ONNX-only model after the hooks' transform(model) -> model, if they have one: the user's patch of the
    file (un-share a tensor, rename an output, cut off post-processing) runs in the build, before simplify."""
    if not hasattr(hooks, "transform"):
        return model
    import onnx
    try:
        result = hooks.transform(model)
    except BuildError:
        raise
    except Exception as e:
        raise BuildError(f"{hooks_path}: transform(model) failed: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}") from e
    if not isinstance(result, onnx.ModelProto):
        raise BuildError(f"{hooks_path}: transform(model) returned {type(result).__name__}, expected an "
                         "onnx.ModelProto (return the model, changed in place or new)")
    return result


def guard_checkpoint_loading(params: dict) -> None:
    """Checkpoints are untrusted input: torch.load runs with weights_only=True (plain tensors, no
    pickled code) unless model.toml says trusted_checkpoints = true."""
    import torch
    if params.get("trusted_checkpoints") or getattr(torch.load, "guarded", False):
        return
    original = torch.load

    def load(*args, **kwargs):
        if kwargs.get("weights_only") is False:
            raise BuildError(f"{params['hooks']}: torch.load(..., weights_only=False) can run code stored in a "
                             f"checkpoint; if you trust the checkpoints, set trusted_checkpoints = true under "
                             f"[model] in {params['model_toml']}")
        kwargs["weights_only"] = True
        return original(*args, **kwargs)

    load.guarded = True
    torch.load = load


def check_sample(sample, specs: dict, where: str) -> dict[str, np.ndarray]:
    """A sample from a data hook must have exactly the declared inputs, shapes and dtypes."""
    if not isinstance(sample, dict):
        raise BuildError(f"{where}: expected a dict of input name -> array, got {type(sample).__name__}")
    if not specs and sample:  # an ONNX-only model may leave them out for simplify to say what they are
        declared = ", ".join(f'{name} = {{ shape = {list(np.shape(a))}, dtype = "{np.asarray(a).dtype}" }}'
                             for name, a in sample.items())
        raise BuildError(f"{where}: model.toml declares no inputs for this graph, which the data hooks' samples are "
                         f"checked against: add them to its [graphs.<name>] table (this sample's: inputs = {{ {declared} }})")
    if set(sample) != set(specs):
        raise BuildError(f"{where}: inputs {sorted(sample)} do not match the graph's inputs {sorted(specs)}")
    checked = {}
    for name, spec in specs.items():
        array = np.asarray(sample[name])
        if tuple(array.shape) != tuple(spec["shape"]) or array.dtype != np.dtype(spec["dtype"]):
            raise BuildError(f"{where}: input '{name}' is {array.dtype}{list(array.shape)}, "
                             f"the graph declares {spec['dtype']}{list(spec['shape'])}")
        checked[name] = np.ascontiguousarray(array)
    return checked


def read_input_list(input_list: str, specs: dict, count: int | None = None) -> list[dict[str, np.ndarray]]:
    """The raw calibration files named by input_list.txt (one line per sample, one path per input)."""
    samples = []
    with open(input_list) as f:
        lines = [line.split() for line in f if line.strip()]
    for line in lines[:count]:
        sample = {}
        for (name, spec), path in zip(specs.items(), line):
            sample[name] = np.fromfile(path, dtype=spec["dtype"]).reshape(spec["shape"])
        samples.append(sample)
    return samples


def compare(reference: list[dict], actual: list[dict], frames: bool = False) -> dict[str, dict[str, float]]:
    """Per output: cosine, SQNR (dB) and max abs error of actual against reference, over all samples.
    frames=True adds frame_cosine: the lowest cosine of one frame, a vector along the last axis (an
    encoder's time step, a decoder's token position), over all frames of all samples. One bad frame
    hides in a whole-tensor cosine of 1500 of them; it does not hide here."""
    metrics = {}
    for name in reference[0]:
        if frames:
            frame_cosines = [_frame_cosine(r[name], a[name]) for r, a in zip(reference, actual)]
        ref = np.concatenate([r[name].astype(np.float64).ravel() for r in reference])
        act = np.concatenate([a[name].astype(np.float64).ravel() for a in actual])
        noise = ref - act
        denominator = np.linalg.norm(ref) * np.linalg.norm(act)
        cosine = float(ref @ act / denominator) if denominator > 0 else float(np.array_equal(ref, act))
        noise_power = float(noise @ noise)
        sqnr = float(10 * np.log10(float(ref @ ref) / noise_power)) if noise_power > 0 else float("inf")
        metrics[name] = {"cosine": cosine, "sqnr": sqnr, "max_abs": float(np.max(np.abs(noise)))}
        if frames:
            metrics[name]["frame_cosine"] = min(frame_cosines)
    return metrics


ZERO_FRAME = 1e-3  # a frame whose norm is at most this fraction of its output's largest frame is a zero frame


def _frame_cosine(reference: np.ndarray, actual: np.ndarray) -> float:
    """The lowest cosine over the frames of one sample's output. A frame of (near) zeros has no direction: two zero
    frames agree (1.0), a zero frame against one that is not disagrees (0.0). Zero means a norm at most ZERO_FRAME of
    the largest frame's norm in either tensor (a sparse per-pixel map's background, where float rounding leaves
    1e-7s in one and exact zeros in the other)."""
    ref = reference.astype(np.float64).reshape(-1, reference.shape[-1] if reference.ndim else 1)
    act = actual.astype(np.float64).reshape(ref.shape)
    ref_norms, act_norms = np.linalg.norm(ref, axis=1), np.linalg.norm(act, axis=1)
    floor = ZERO_FRAME * max(ref_norms.max(initial=0.0), act_norms.max(initial=0.0))
    ref_zero, act_zero = ref_norms <= floor, act_norms <= floor
    norms = ref_norms * act_norms
    dots = np.einsum("ij,ij->i", ref, act)
    cosines = np.where(ref_zero | act_zero, np.where(ref_zero & act_zero, 1.0, 0.0),
                       dots / np.where(norms > 0, norms, 1))
    return float(cosines.min())


def worst(metrics: dict[str, dict[str, float]], metric: str) -> float:
    """The worst value of a metric over all outputs (lowest cosine/SQNR, highest max abs)."""
    values = [m[metric] for m in metrics.values()]
    return max(values) if metric == "max_abs" else min(values)


def save_arrays(path: str, arrays: dict[str, np.ndarray]) -> None:
    """Like np.savez, but byte-identical for identical arrays (np.savez stamps the current time)."""
    import io
    import zipfile
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for name, array in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.asarray(array), allow_pickle=False)
            archive.writestr(zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)), buffer.getvalue())


def load_evaluation(path: str, limit: int | None = None) -> tuple[list[dict], list[dict]]:
    """(inputs, float reference outputs) saved by verify; the first `limit` samples only, when given (the others
    are not read)."""
    with np.load(path) as data:
        count = int(data["count"]) if limit is None else min(int(data["count"]), limit)
        inputs = [{} for _ in range(count)]
        outputs = [{} for _ in range(count)]
        for key in data.files:
            if "/" not in key:  # count, labels
                continue
            index, kind, name = key.split("/", 2)
            if kind in ("input", "output") and int(index) < count:
                (inputs if kind == "input" else outputs)[int(index)][name] = data[key]
    return inputs, outputs


# --- labels: evaluation_inputs() may return (inputs, label) pairs; verify keeps the labels for score() ----------

LABEL_KINDS = ("value", "dict")  # the npz's "labels" entry: one label per sample, or a dict of them


def split_labels(samples: list, where: str) -> tuple[list, list | None]:
    """(inputs, labels) of a data hook's samples: each a {name: array} dict, or every one an (inputs, label) pair.
    labels is None when the hook returned plain dicts."""
    pairs = [isinstance(s, (tuple, list)) and len(s) == 2 and isinstance(s[0], dict) for s in samples]
    if not any(pairs):
        return samples, None
    if not all(pairs):
        first = pairs.index(not pairs[0])
        raise BuildError(f"{where}: sample {first} is {'an (inputs, label) pair' if pairs[first] else 'a plain dict'} "
                         f"but sample 0 is {'an (inputs, label) pair' if pairs[0] else 'a plain dict'}: return "
                         "(inputs, label) pairs for every sample or for none")
    return [s[0] for s in samples], [s[1] for s in samples]


def label_arrays(labels: list, where: str) -> dict[str, np.ndarray]:
    """The labels as npz entries: `<i>/label/value`, or `<i>/label/<key>` for dict labels, and `labels` (the kind).
    A label is a number, a string, a bool, an array (or a rectangular list), or a dict of those by name."""
    kinds = {isinstance(label, dict) for label in labels}
    if len(kinds) > 1:
        raise BuildError(f"{where}: some labels are dicts and some are not: give every sample the same kind of label")
    arrays = {"labels": np.array(LABEL_KINDS[1] if kinds == {True} else LABEL_KINDS[0])}
    for i, label in enumerate(labels):
        for name, value in (label.items() if isinstance(label, dict) else [("value", label)]):
            if not isinstance(name, str) or not name or "/" in name:
                raise BuildError(f"{where}: sample {i}: label key {name!r} must be a non-empty string without '/'")
            try:
                array = np.asarray(value)
            except ValueError:  # numpy refuses ragged nested lists
                array = np.empty(0, dtype=object)
            if value is None or array.dtype == object:
                raise BuildError(f"{where}: sample {i}: label{'' if name == 'value' else f' {name!r}'} of type "
                                 f"{type(value).__name__} cannot be kept for score(): use a number, a string, an array "
                                 "(a ragged list: one array per field in a dict label), or a dict of those")
            arrays[f"{i}/label/{name}"] = array
    return arrays


def load_labels(path: str) -> list | None:
    """The labels verify kept beside the evaluation inputs (None when the hook returned none): per sample a number,
    string or array, or a dict of them, as evaluation_inputs returned them (0-d arrays back to Python scalars)."""
    def plain(array):
        return array.item() if array.ndim == 0 else array

    with np.load(path) as data:
        if "labels" not in data.files:
            return None
        kind, count = str(data["labels"]), int(data["count"])
        labels = [{} for _ in range(count)]
        for key in data.files:
            parts = key.split("/", 2)
            if len(parts) == 3 and parts[1] == "label":
                labels[int(parts[0])][parts[2]] = plain(data[key])
    return labels if kind == "dict" else [label["value"] for label in labels]


def score(hooks, graph: str, inputs: list[dict], outputs: list[dict], float_outputs: list[dict],
          labels: list | None, where: str) -> dict[str, float]:
    """The score hook's task metrics. score(graph, inputs, outputs) as ever; a hook that names a `float_outputs` or
    `labels` parameter (or takes **kwargs) also gets the float model's outputs for the same inputs and the labels of
    evaluation_inputs(), by keyword."""
    import inspect
    parameters = inspect.signature(hooks.score).parameters
    any_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    extra = {}
    if any_keyword or "float_outputs" in parameters:
        extra["float_outputs"] = float_outputs
    if any_keyword or "labels" in parameters:
        wanted = parameters.get("labels")
        if labels is None and wanted is not None and wanted.default is inspect.Parameter.empty:
            raise BuildError(f"{where}: score() takes labels, but evaluation_inputs({graph!r}) returned none: return "
                             "(inputs, label) pairs from it, or give labels a default (labels=None)")
        extra["labels"] = labels
    return {k: float(v) for k, v in hooks.score(graph, inputs, outputs, **extra).items()}


def evenly_spaced(count: int, wanted: int) -> list[int]:
    """`wanted` indices of `count` samples, evenly spaced, first and last included (all when wanted >= count)."""
    if wanted >= count:
        return list(range(count))
    if wanted <= 1:
        return [0]
    return sorted({round(i * (count - 1) / (wanted - 1)) for i in range(wanted)})

"""Stage 4, calibrate: real inputs from the calibration_inputs hook -> raw files + input_list.txt.

The format is QNN's (ndarray.tofile: headerless, C order, native little-endian; one line per
sample, one path per input, in input order), so both toolchains and every variant share it.
"""
from __future__ import annotations

from pathlib import Path

from ..plumbing import progress
from ..errors import BuildError
from ..build_state.layout import raw_name
from ..measuring.samples import check_sample, load_hooks


def run(params: dict) -> dict:
    hooks = load_hooks(params["hooks"], params.get("data_dir"), params.get("checkpoints"))
    graph, count, specs = params["graph"], params["count"], params["inputs"]
    if not hasattr(hooks, "calibration_inputs"):
        raise BuildError(f"{params['hooks']}: no calibration_inputs(graph, count) hook")
    samples = list(progress.track(hooks.calibration_inputs(graph, count), "samples", total=count))
    where = f"{params['hooks']}: calibration_inputs({graph!r}, {count})"
    if not samples:
        raise BuildError(f"{where} returned no samples: calibration needs real inputs")
    if len(samples) < count:
        raise BuildError(f"{where} returned {len(samples)} samples, {count} asked for "
                         f"(lower calibration_samples in model.toml)")
    staged_dir = Path(params["outputs"]["dir"])
    final_dir = Path(params["final_outputs"]["dir"])
    staged_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, sample in enumerate(samples[:count]):
        sample = check_sample(sample, specs, f"{where} sample {i}")
        paths = []
        for name in specs:
            file_name = raw_name(i, name)
            sample[name].tofile(staged_dir / file_name)
            paths.append(str(final_dir / file_name))
        lines.append(" ".join(paths))
    with open(params["outputs"]["input_list"], "w") as f:
        f.write("\n".join(lines) + "\n")
    return {"samples": len(lines)}

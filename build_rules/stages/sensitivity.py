"""Sensitivity (ort-qnn, `doit sensitivity`): rank a graph's activation tensors by what quantizing them to 8 bit costs.

Measured on the HTP emulator for the tuning chip, against the float model, per tensor t of the variant's graph:
- cost_db: SQNR with every candidate at 16 bit, minus SQNR with all but t at 16 bit (what 8-bit t alone costs);
- gain_db: SQNR with t alone at 16 bit, minus SQNR with none (what 16-bit t alone buys);
- htp_sqnr_db / local_drop_db: the tensor's own SQNR on the emulator when every intermediate tensor is exposed
  as an output (an HTP-true version of onnxruntime's qdq_loss_debug), and how much it drops from the node's input;
- cpu_qdq_sqnr_db, cpu_xmodel_sqnr_db: onnxruntime's qdq_loss_debug on the CPU, for comparison only. Its two
  pitfalls (research/ort-qnn.md §5) are avoided: the model is converted to opset 21 first, so 16-bit Q/DQ are not
  com.microsoft ops (whose activations it cannot match), and weight errors are computed here with int32
  arithmetic instead of create_weight_matching's wrapping uint8 (weight_sqnr_db).
Single-tensor effects interact (a lone 16-bit tensor between 8-bit neighbours often buys nothing: converts, fused
ops), so the ranking orders the tune stage's search, which verifies every step; it is not a plan by itself.
Writes <graph>.sensitivity.json, .md (table) and .png (bars).
"""
from __future__ import annotations

import math
import time
from pathlib import Path

from .. import progress
from ..files import atomic_write_json, atomic_write_text
from .precision import Candidates, clean

VERSION = 1


def run(params: dict) -> dict:
    started = time.perf_counter()
    c = Candidates(params["graph"], params["chip"], params["samples"], params["hooks"], params.get("data_dir"))
    tensors = c.candidates
    producers = c.producers()
    progress.watch(lambda: c.evaluations, "emulator measurements", 2 + 2 * len(tensors))  # base, top, 2 a tensor
    print(f"{len(tensors)} candidate tensors, {len(c.subset)} evaluation samples, chip {params['chip']['name']}",
          flush=True)
    base = c.measure(set())
    top = c.measure(set(tensors))
    rows = costs(c, tensors)
    for row in rows:
        t = row["tensor"]
        alone = c.measure({t})
        node, op_type = producers.get(t, ("", ""))
        row.update(node=node, op_type=op_type, gain_db=_delta(alone["sqnr"], base["sqnr"]),
                   gain_cosine=alone["cosine"] - base["cosine"])
        print(f"  {t}: cost {row['cost_db']:.2f} dB, gain {row['gain_db']:.2f} dB", flush=True)
    profile = _htp_profile(c, tensors)
    cpu = _cpu_qdq_errors(c)
    weights = _weight_errors(c, producers)
    for row in rows:
        row.update(profile.get(row["tensor"], {}))
        row.update(cpu.get(row["tensor"], {}))
        if row["tensor"] in weights:
            row["weight_sqnr_db"] = weights[row["tensor"]]
    ranking = sorted(rows, key=lambda r: (-r["cost_db"], -(r.get("local_drop_db") or 0.0), -r["gain_db"]))
    for rank, row in enumerate(ranking, 1):
        row["rank"] = rank
    result = {"graph": params["graph"]["name"], "variant": params["variant_name"], "chip": params["chip"]["name"],
              "samples": len(c.subset), "base": clean(base), "all_16bit": clean(top), "tensors": ranking,
              "evaluations": c.evaluations, "seconds": round(time.perf_counter() - started, 1),
              "key": ranking_key(c, params["hooks"])}
    atomic_write_json(params["outputs"]["json"], result)
    atomic_write_text(params["outputs"]["markdown"], markdown(result))
    plot(result, params["outputs"]["png"])
    return {"candidates": len(tensors), "evaluations": c.evaluations}


def costs(c: Candidates, tensors: list[str]) -> list[dict]:
    """Per tensor: what keeping only it at 8 bit (every other candidate at 16) costs, in dB and cosine."""
    top = c.measure(set(tensors))
    rows = []
    for t in tensors:
        without = c.measure(set(tensors) - {t})
        rows.append({"tensor": t, "cost_db": _delta(top["sqnr"], without["sqnr"]),
                     "cost_cosine": top["cosine"] - without["cosine"]})
    return rows


def ranking_key(c: Candidates, hooks: str) -> dict:
    """What a ranking depends on: the tune stage reuses a sensitivity result only when this matches."""
    from ..hashing import file_digest
    from .check import hooks_digest
    return {"version": VERSION, "variant": c.graph["variant"], "chip": c.chip, "samples": len(c.subset),
            **{k: file_digest(c.graph[k]) for k in ("onnx", "ranges", "evaluation")}, "hooks": hooks_digest(hooks)}


def ranking(c: Candidates, hooks: str, sensitivity: str | None) -> tuple[list[str], str]:
    """Candidates, most costly at 8 bit first: from the sensitivity stage's result when it was made from the same
    inputs, else measured here (cost only: one emulator run per tensor). Returns (tensors, where from)."""
    import json
    if sensitivity and Path(sensitivity).is_file():
        try:
            saved = json.loads(Path(sensitivity).read_text())
            if saved.get("key") == ranking_key(c, hooks):
                order = [r["tensor"] for r in saved["tensors"] if r["tensor"] in c.candidates]
                return order + [t for t in c.candidates if t not in order], sensitivity
        except (OSError, ValueError, KeyError):
            pass
    rows = costs(c, c.candidates)
    position = {t: i for i, t in enumerate(c.candidates)}
    rows.sort(key=lambda r: (-r["cost_db"], -r["cost_cosine"], position[r["tensor"]]))
    return [r["tensor"] for r in rows], "measured (cost only)"


def _delta(a: float, b: float) -> float:
    if math.isinf(a) and math.isinf(b):
        return 0.0
    return max(min(a - b, 999.0), -999.0)


def _htp_profile(c: Candidates, tensors: list[str]) -> dict:
    """Each tensor's SQNR on the emulator (8-bit everywhere, every candidate exposed) against the float model."""
    import numpy as np
    from ..toolchains import ort_qnn
    from .common import compare
    try:
        exposed = c.quantize(set(), c.work / "profile.onnx", extra_outputs=tensors)
        emulated = c.run(exposed, c.subset)
        model = ort_qnn.preprocessed_model(c.graph["onnx"])
        ort_qnn._expose(model, tensors)
        ort = ort_qnn._ort()
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        reference = [dict(zip(names, session.run(names, c.inputs[i]))) for i in c.subset]
    except Exception as e:  # the profile is extra information: never fail the ranking for it
        print(f"HTP profile skipped: {type(e).__name__}: {e}", flush=True)
        return {}
    model = ort_qnn.preprocessed_model(c.graph["onnx"])
    # The quantizer folds a Relu/Clip into its producer (the producer's output is quantized with the activation's
    # range, research/ort-qnn.md §5): compare such a tensor with the float value after the activation.
    consumers = {}
    for node in model.graph.node:
        for i in node.input:
            consumers.setdefault(i, []).append(node)
    after = {t: users[0].output[0] for t, users in consumers.items()
             if len(users) == 1 and users[0].op_type in ("Relu", "Clip") and users[0].output[0] in reference[0]}
    shared = [t for t in tensors if t in emulated[0] and t in reference[0]]
    metrics = compare([{t: r[after.get(t, t)] for t in shared} for r in reference],
                      [{t: np.asarray(e[t]).reshape(np.shape(r[t])) for t in shared} for e, r in zip(emulated, reference)])
    sqnr = {t: m["sqnr"] for t, m in metrics.items()}
    out = {}
    for node in model.graph.node:
        sources = [sqnr[i] for i in node.input if i in sqnr]
        for o in node.output:
            if o in sqnr:
                # A node fed only by graph inputs (not exposed) has no measured "before": no local drop.
                drop = None if not sources or math.isinf(sqnr[o]) else round(min(min(sources), 200.0) - sqnr[o], 3)
                out[o] = {"htp_sqnr_db": _finite(sqnr[o]), "local_drop_db": drop}
    return out


def _cpu_qdq_errors(c: Candidates) -> dict:
    """onnxruntime's qdq_loss_debug on the CPU (opset 21 first: pitfall (a) of research/ort-qnn.md §5)."""
    try:
        import onnx
        from onnx import version_converter
        from onnxruntime.quantization.qdq_loss_debug import (collect_activations, compute_activation_error,
                                                             create_activation_matching,
                                                             modify_model_output_intermediate_tensors)
        from ..toolchains import ort_qnn

        model = ort_qnn.preprocessed_model(c.graph["onnx"])
        if max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) < 21:
            model = version_converter.convert_version(model, 21)
        float21 = c.work / "float21.onnx"
        onnx.save(model, str(float21))
        graph = dict(c.graph, onnx=str(float21))
        base = Candidates.__new__(Candidates)
        base.__dict__.update(c.__dict__)
        base.graph = graph
        qdq = base.quantize(set(), c.work / "cpu_qdq.onnx")
        samples = [c.inputs[i] for i in c.subset]
        acts = {}
        for name, path in (("qdq", qdq), ("float", float21)):
            augmented = c.work / f"{name}_aug.onnx"
            modify_model_output_intermediate_tensors(str(path), str(augmented))
            acts[name] = collect_activations(str(augmented), ort_qnn.CalibrationReader(samples),
                                             execution_providers=["CPUExecutionProvider"])
        errors = compute_activation_error(create_activation_matching(acts["qdq"], acts["float"]))
    except Exception as e:  # comparison only: never fail the ranking for it
        print(f"CPU qdq_loss_debug skipped: {type(e).__name__}: {e}", flush=True)
        return {}
    return {t: {"cpu_qdq_sqnr_db": _finite(e.get("qdq_err")), "cpu_xmodel_sqnr_db": _finite(e.get("xmodel_err"))}
            for t, e in errors.items()}


def _weight_errors(c: Candidates, producers: dict) -> dict:
    """SQNR of each node's dequantized weight, computed in int32 (create_weight_matching wraps in uint8: pitfall (b)),
    keyed by the node's output tensor."""
    try:
        import numpy as np
        import onnx
        from onnx import numpy_helper
        from ..toolchains import ort_qnn

        qdq = onnx.load(str(c.quantize(set(), c.work / "weights.onnx")))
        floats = {i.name: numpy_helper.to_array(i) for i in ort_qnn.preprocessed_model(c.graph["onnx"]).graph.initializer}
        inits = {i.name: i for i in qdq.graph.initializer}
        consumers = {}
        for node in qdq.graph.node:
            for i in node.input:
                consumers.setdefault(i, []).append(node)
        outputs_of = {}
        for tensor, (node_name, _) in producers.items():
            outputs_of.setdefault(node_name, []).append(tensor)
        result = {}
        for node in qdq.graph.node:
            if node.op_type != "DequantizeLinear" or node.input[0] not in inits:
                continue
            name = node.input[0]
            original = name[:-len("_quantized")] if name.endswith("_quantized") else name
            if original not in floats or floats[original].ndim < 2:
                continue  # biases and scalars
            q = numpy_helper.to_array(inits[name]).astype(np.int64)
            scale = numpy_helper.to_array(inits[node.input[1]]).astype(np.float64)
            zero = numpy_helper.to_array(inits[node.input[2]]).astype(np.int64) if len(node.input) > 2 and \
                node.input[2] in inits else np.zeros_like(scale, dtype=np.int64)
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            if scale.ndim == 1 and scale.size > 1:
                shape = [1] * q.ndim
                shape[axis] = scale.size
                scale, zero = scale.reshape(shape), zero.reshape(shape)
            dequantized = (q - zero).astype(np.float64) * scale
            ref = floats[original].astype(np.float64)
            noise = float(np.sum((ref - dequantized) ** 2))
            sqnr = 10 * math.log10(float(np.sum(ref ** 2)) / noise) if noise > 0 else float("inf")
            for consumer in consumers.get(node.output[0], []):
                # by node name: the quantizer may rename a node's output (a folded Relu's name)
                for out in outputs_of.get(consumer.name, consumer.output):
                    result[out] = _finite(sqnr)
        return result
    except Exception as e:
        print(f"weight errors skipped: {type(e).__name__}: {e}", flush=True)
        return {}


def _finite(value):
    if value is None:
        return None
    value = float(value)
    return round(value, 3) if math.isfinite(value) else 999.0


def markdown(result: dict) -> str:
    lines = [f"# Sensitivity: {result['graph']} / {result['variant']} on {result['chip']} (HTP emulator)", "",
             f"{result['samples']} evaluation samples. Worst-output SQNR: all candidates at 8 bit "
             f"{result['base']['sqnr']:.2f} dB (cosine {result['base']['cosine']:.5f}), all at 16 bit "
             f"{result['all_16bit']['sqnr']:.2f} dB (cosine {result['all_16bit']['cosine']:.5f}).", "",
             "cost: SQNR lost when only this tensor is 8-bit (others 16); gain: SQNR won when only this tensor is "
             "16-bit; HTP SQNR / local drop: the tensor itself on the emulator; CPU columns: qdq_loss_debug "
             "(comparison only; the emulator differs).", "",
             "| rank | tensor | op | cost (dB) | gain (dB) | HTP SQNR (dB) | local drop (dB) | CPU qdq SQNR (dB) "
             "| CPU xmodel SQNR (dB) | weight SQNR (dB) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["tensors"]:
        cells = [str(r["rank"]), f"`{r['tensor']}`", r["op_type"], f"{r['cost_db']:.2f}", f"{r['gain_db']:.2f}"]
        for key in ("htp_sqnr_db", "local_drop_db", "cpu_qdq_sqnr_db", "cpu_xmodel_sqnr_db", "weight_sqnr_db"):
            value = r.get(key)
            cells.append("–" if value is None else f"{value:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"![sensitivity]({Path(result['graph']).name}.sensitivity.png)", ""]
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["tensors"]
    labels = [r["tensor"].strip("/").replace("_output_0", "")[-28:] for r in rows]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(rows) + 2), 4.2))
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r["cost_db"] for r in rows], width=0.4, label="cost of 8 bit (dB)")
    ax.bar([i + 0.2 for i in x], [r["gain_db"] for r in rows], width=0.4, label="gain of 16 bit alone (dB)")
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize="x-small")
    ax.axhline(0, color="black", linewidth=0.5)
    ax.set_ylabel("worst-output SQNR change (dB)")
    ax.set_title(f"{result['graph']} / {result['variant']} on {result['chip']}: per-tensor sensitivity")
    ax.legend(fontsize="small")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)

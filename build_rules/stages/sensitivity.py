"""Sensitivity (ort-qnn, `doit sensitivity`): rank a graph's activation tensors by what quantizing them to 8 bit costs.

On the CPU, for every tensor (cpu_ranking.py: the all-8-bit QDQ model with a switch per tensor, one run per
measurement and no quantize or compile; comparison and ordering only, research/ort-qnn.md §4):
- cpu_cost_db: SQNR with every candidate at 16 bit, minus SQNR with all but this one at 16 bit;
- cpu_gain_db: SQNR with this one alone at 16 bit, minus SQNR with none;
- cpu_qdq_sqnr_db, cpu_xmodel_sqnr_db: onnxruntime's qdq_loss_debug, with its two pitfalls (research/ort-qnn.md §5)
  avoided: opset 21 first, so 16-bit Q/DQ are not com.microsoft ops, and weight errors in int32 (weight_sqnr_db).
On the HTP emulator for the tuning chip, against the float model, with [tuning] search =
- "bisect" (default): a tensor whose producer's and consumers' outputs are at 16 bit is written at 16 bit by the
  quantizer whatever its own setting (precision.Candidates.effective): its cost alone is 0, known without a run (in
  the graphs tried, every tensor but the first after an input). The others (up to CONFIRM) get their cost alone
  measured, and the CPU ranking's top CONFIRM tensors their gain alone. Then the gains of groups of tensors, halving:
  a group (contiguous in graph order) gains what it alone at 16 bit buys (every other candidate at 8); starting
  from all candidates, the group that gains most, if it matters (GAIN_THRESHOLD of all-16-bit's gain), is split in
  two and both halves measured, down to single tensors, until [tuning] max_measurements is spent. A region the CPU
  cannot see (an HTP-only divergence) is a group that gains here. Gains, not costs: a measurement with few 16-bit
  tensors is the cheap one (16-bit activations can run much slower on the emulator: 24x for PP-OCRv4's detector,
  1.5x for MTCNN's R-Net).
- "exhaustive": cost_db and gain_db of every tensor alone on the emulator (2 runs a tensor).
cost_db / gain_db: those on the emulator, for a tensor measured alone (None when not); group_gain_db: the gain of
the smallest measured group around it.
Also htp_sqnr_db / local_drop_db: the tensor's own SQNR on the emulator when every intermediate tensor is exposed as
an output (an HTP-true version of qdq_loss_debug), and how much it drops from the node's input.
Single-tensor effects interact (a lone 16-bit tensor between 8-bit neighbours often buys nothing: converts, fused
ops), so the ranking orders the tune stage's search, which verifies every step; it is not a plan by itself.
Writes <graph>.sensitivity.json, .md (table) and .png (bars).
"""
from __future__ import annotations

import heapq
import math
import time
from pathlib import Path

from ..plumbing import progress
from ..plumbing.files import atomic_write_json, atomic_write_text
from .support.precision import Candidates, clean, delta_db

RANKING_VERSION = 2  # what a stored ranking was made by: tune reuses one only when it matches
GAIN_THRESHOLD = 0.05  # a group (or a cost alone) matters from this share of all-16-bit's gain (and 0.1 dB) on
CONFIRM = 4  # the CPU ranking's top tensors measured alone on the emulator
PLOTTED = 40  # tensors in the .png (the .md lists all)


def run(params: dict) -> dict:
    from ..errors import BuildError
    try:
        return _rank(params)
    except BuildError as e:  # a candidate the HTP does not build (precision.py) says which task met it
        raise BuildError(f"{params['name']}: {e}") from None


def _rank(params: dict) -> dict:
    started = time.perf_counter()
    c = Candidates(params["graph"], params["chip"], params["samples"], params["hooks"], params.get("data_dir"))
    method = params["search"]["method"]
    tensors = c.candidates
    producers = c.producers()
    total = 2 + 2 * len(tensors) if method == "exhaustive" else None  # bisect: a search, no total known ahead
    progress.watch(lambda: c.evaluations, "emulator measurements", total)
    print(f"{len(tensors)} candidate tensors, {len(c.subset)} evaluation samples, chip {params['chip']['name']}, "
          f"search {method}", flush=True)
    base = c.measure(set(), end=True)
    top = c.measure(set(tensors), end=True)
    for name, end in (("every candidate at 8 bit", base), ("every candidate at 16 bit", top)):
        if end.get("unstable"):
            print(f"{name} does not repeat itself on the emulator ({end['unstable']}): its numbers are the worst of "
                  "its runs", flush=True)
    cpu, cpu_rows = _cpu(c)
    groups = []
    if method == "exhaustive":
        rows = costs(c, tensors)
        for row in rows:
            alone = c.measure({row["tensor"]})
            row.update(gain_db=delta_db(alone["sqnr"], base["sqnr"]), gain_cosine=alone["cosine"] - base["cosine"])
            print(f"  {row['tensor']}: cost {row['cost_db']:.2f} dB, gain {row['gain_db']:.2f} dB", flush=True)
    else:
        rows, groups = _bisect(c, base, top, cpu_rows, params["search"]["max_measurements"])
    for row in rows:
        node, op_type = producers.get(row["tensor"], ("", ""))
        row.update(node=node, op_type=op_type, **cpu_rows.get(row["tensor"], {}))
    profile = _htp_profile(c, tensors)
    qdq = _cpu_qdq_errors(c)
    weights = _weight_errors(c, producers)
    for row in rows:
        row.update(profile.get(row["tensor"], {}))
        row.update(qdq.get(row["tensor"], {}))
        if row["tensor"] in weights:
            row["weight_sqnr_db"] = weights[row["tensor"]]
    ranking = _ranked(rows, groups, method, max(0.1, GAIN_THRESHOLD * delta_db(top["sqnr"], base["sqnr"])))
    for rank, row in enumerate(ranking, 1):
        row["rank"] = rank
    result = {"graph": params["graph"]["name"], "variant": params["variant_name"], "chip": params["chip"]["name"],
              "search": method, "samples": len(c.subset), "base": clean(base), "all_16bit": clean(top),
              "tensors": ranking, "groups": groups, "evaluations": c.evaluations,
              "emulator_seconds": round(c.seconds, 1), "cpu_evaluations": cpu.evaluations if cpu else 0,
              "cpu_seconds": round(cpu.seconds + cpu.build_seconds, 1) if cpu else 0.0,
              "seconds": round(time.perf_counter() - started, 1), "key": ranking_key(c, params["hooks"])}
    atomic_write_json(params["outputs"]["json"], result)
    atomic_write_text(params["outputs"]["markdown"], markdown(result))
    plot(result, params["outputs"]["png"])
    print(f"{c.evaluations} emulator measurements ({c.seconds:.0f} s), {result['cpu_evaluations']} on the CPU "
          f"({result['cpu_seconds']:.0f} s)", flush=True)
    return {"candidates": len(tensors), "evaluations": c.evaluations}


def _cpu(c: Candidates):
    """(the CPU switch model, {tensor: cpu_cost_db, cpu_gain_db}); (None, {}) when it cannot be built."""
    from .support import cpu_ranking
    try:
        cpu = cpu_ranking.SwitchModel(c)
        rows = cpu_ranking.costs(cpu, c.candidates)
    except Exception as e:  # the CPU ranking orders the emulator's work: without it, graph order
        print(f"CPU ranking skipped: {type(e).__name__}: {e}", flush=True)
        return None, {}
    print(f"CPU ranking: {cpu.evaluations} CPU QDQ runs, {cpu.seconds + cpu.build_seconds:.1f} s", flush=True)
    return cpu, rows


def _bisect(c: Candidates, base: dict, top: dict, cpu_rows: dict, budget: int) -> tuple[list[dict], list[dict]]:
    """Rows with emulator group gains (and cost / gain alone where measured), and the measured groups."""
    from .support import cpu_ranking
    tensors = c.candidates
    everything = set(tensors)
    all_16 = c.effective(everything)
    spent = budget  # every emulator measurement of the task but the exposed-tensor profile
    covered = {t for t in tensors if c.effective(everything - {t}) == all_16}
    # confirmed alone first: the tensors whose 8 bit alone can cost anything (the quantizer leaves every other one
    # at 16 bit when its neighbours are: cost 0, no run), and the CPU's top tensors' gain
    cost, gain = {t: 0.0 for t in covered}, {}
    for t in [t for t in tensors if t not in covered][:CONFIRM]:
        cost[t] = delta_db(top["sqnr"], c.measure(everything - {t})["sqnr"])
        print(f"  {t}: cost {cost[t]:.2f} dB alone", flush=True)
    ranked = [t for t in cpu_ranking.order(tensors, cpu_rows) if cpu_rows.get(t, {}).get("cpu_gain_db") is not None]
    for t in ranked[:CONFIRM]:
        gain[t] = delta_db(c.measure({t})["sqnr"], base["sqnr"])
        print(f"  {t} (CPU top {CONFIRM}): gain {gain[t]:.2f} dB alone", flush=True)
    # then groups in graph order, halving the one that gains most while the budget lasts
    whole = delta_db(top["sqnr"], base["sqnr"])
    threshold = max(0.1, GAIN_THRESHOLD * whole)
    groups = [{"first": 0, "size": len(tensors), "gain_db": round(whole, 3)}]
    heap = [(-whole, 0, len(tensors))]
    while heap and c.evaluations + 2 <= spent:
        negative, lo, hi = heapq.heappop(heap)
        if hi - lo < 2 or -negative < threshold:
            continue
        middle = (lo + hi) // 2
        for a, b in ((lo, middle), (middle, hi)):
            value = delta_db(c.measure(set(tensors[a:b]))["sqnr"], base["sqnr"])
            groups.append({"first": a, "size": b - a, "gain_db": round(value, 3)})
            if b - a == 1:
                gain[tensors[a]] = value
            print(f"  {_group_name(tensors[a:b])}: gain {value:.2f} dB at 16 bit", flush=True)
            heapq.heappush(heap, (-value, a, b))
    if any(hi - lo > 1 and -negative >= threshold for negative, lo, hi in heap):
        print(f"budget of {budget} emulator measurements spent ([tuning] max_measurements): groups that gain "
              f"{threshold:.2f} dB or more are left unsplit", flush=True)
    rows = []
    for i, t in enumerate(tensors):
        group = min((g for g in groups if g["first"] <= i < g["first"] + g["size"]), key=lambda g: g["size"])
        rows.append({"tensor": t, "cost_db": cost.get(t), "gain_db": gain.get(t), "group_gain_db": group["gain_db"],
                     "group_size": group["size"]})
    for g in groups:
        g["tensors"] = tensors[g["first"]:g["first"] + g["size"]]
    return rows, groups


def _ranked(rows: list[dict], groups: list[dict], method: str, threshold: float = 0.0) -> list[dict]:
    """The rows, most important first.
    bisect: first the tensors whose 8 bit alone costs what matters (nothing else makes them 16 bit: they are the
    exhaustive search's top), costliest first; then down the measured group tree, the half that gains more first (so
    a prefix of the ranking is the region that 16 bit helps most, which tune's search puts at 16 bit first); inside
    a group not split further, by the cost alone, the gain alone, the CPU's cost and gain, then graph order.
    exhaustive: the cost alone, the local drop, the gain (as before)."""
    position = {r["tensor"]: i for i, r in enumerate(rows)}
    if method == "exhaustive":
        return sorted(rows, key=lambda r: (-r["cost_db"], -(r.get("local_drop_db") or 0.0), -r["gain_db"],
                                           position[r["tensor"]]))

    def alone(r):
        return (-(r["cost_db"] or 0.0), -(r["gain_db"] or 0.0), -(r.get("cpu_cost_db") or 0.0),
                -(r.get("cpu_gain_db") or 0.0), position[r["tensor"]])

    gains = {(g["first"], g["size"]): g["gain_db"] for g in groups}

    def walk(first: int, size: int) -> list[dict]:
        half = size // 2
        children = [(first, half), (first + half, size - half)]
        if size < 2 or not all(child in gains for child in children):
            return sorted(rows[first:first + size], key=alone)
        children.sort(key=lambda child: -gains[child])  # stable: the earlier half first on a tie
        return [r for child in children for r in walk(*child)]
    costly = sorted((r for r in rows if (r["cost_db"] or 0.0) >= threshold > 0), key=alone)
    return costly + [r for r in walk(0, len(rows)) if r not in costly]


def _group_name(group: list[str]) -> str:
    return group[0] if len(group) == 1 else f"{len(group)} tensors {group[0]} .. {group[-1]}"


def costs(c: Candidates, tensors: list[str]) -> list[dict]:
    """Per tensor: what keeping only it at 8 bit (every other candidate at 16) costs, in dB and cosine."""
    top = c.measure(set(tensors))
    rows = []
    for t in tensors:
        without = c.measure(set(tensors) - {t})
        rows.append({"tensor": t, "cost_db": delta_db(top["sqnr"], without["sqnr"]),
                     "cost_cosine": top["cosine"] - without["cosine"]})
    return rows


def ranking_key(c: Candidates, hooks: str) -> dict:
    """What a ranking depends on: the tune stage reuses a sensitivity result only when this matches."""
    from ..build_state.hashing import file_digest
    from .check import hooks_digest
    return {"version": RANKING_VERSION, "variant": c.graph["variant"], "chip": c.chip, "samples": len(c.subset),
            **{k: file_digest(c.graph[k]) for k in ("onnx", "ranges", "evaluation")}, "hooks": hooks_digest(hooks)}


def saved_ranking(c: Candidates, hooks: str, sensitivity: str | None) -> list[str] | None:
    """The sensitivity stage's ranking (candidates, most important first) when it was made from the same inputs."""
    import json
    if not sensitivity or not Path(sensitivity).is_file():
        return None
    try:
        saved = json.loads(Path(sensitivity).read_text())
        if saved.get("key") != ranking_key(c, hooks):
            return None
        order = [r["tensor"] for r in saved["tensors"] if r["tensor"] in c.candidates]
    except (OSError, ValueError, KeyError):
        return None
    return order + [t for t in c.candidates if t not in order]


def emulator_cost_ranking(c: Candidates) -> list[str]:
    """Candidates by what 8 bit alone costs on the emulator (one run per tensor), the exhaustive search's order."""
    rows = costs(c, c.candidates)
    position = {t: i for i, t in enumerate(c.candidates)}
    rows.sort(key=lambda r: (-r["cost_db"], -r["cost_cosine"], position[r["tensor"]]))
    return [r["tensor"] for r in rows]


def _htp_profile(c: Candidates, tensors: list[str]) -> dict:
    """Each tensor's SQNR on the emulator (8-bit everywhere, every candidate exposed) against the float model."""
    import numpy as np
    from ..toolchains import ort_qnn
    from ..measuring.samples import compare
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
    bisect = result.get("search", "bisect") != "exhaustive"
    lines = [f"# Sensitivity: {result['graph']} / {result['variant']} on {result['chip']}", "",
             f"{result['samples']} evaluation samples, search `{result.get('search', 'exhaustive')}`: "
             f"{result['evaluations']} HTP emulator measurements ({result.get('emulator_seconds', 0):.0f} s), "
             f"{result.get('cpu_evaluations', 0)} on the CPU ({result.get('cpu_seconds', 0):.0f} s). "
             f"Worst-output SQNR on the emulator: all candidates at 8 bit {result['base']['sqnr']:.2f} dB (cosine "
             f"{result['base']['cosine']:.5f}), all at 16 bit {result['all_16bit']['sqnr']:.2f} dB (cosine "
             f"{result['all_16bit']['cosine']:.5f}).", "",
             *[f"**{name} does not repeat itself on the emulator** ({end['unstable']}): its numbers above are the "
               "worst of its runs, and every gain below is measured against a model that gives other outputs on "
               "another run (docs/building.md, \"A binary that does not repeat itself\"; `doit diagnose` finds "
               "where it starts).\n" for name, end in (("Every candidate at 8 bit", result["base"]),
                                                       ("Every candidate at 16 bit", result["all_16bit"]))
               if end.get("unstable")],
             "Emulator: cost, SQNR lost when only this tensor is 8-bit (others 16); gain, SQNR won when only this "
             "tensor is 16-bit; – where not measured alone" + ("; group gain, what the smallest measured group of "
                                                               "tensors around it gains at 16 bit" if bisect else "")
             + "; HTP SQNR / local drop, the tensor itself with every tensor exposed. CPU (ordering and comparison "
             "only; the emulator differs): cost and gain the same way on the CPU QDQ model; qdq and xmodel SQNR, "
             "onnxruntime's qdq_loss_debug.", ""]
    columns = ["rank", "tensor", "op", *(["group gain (dB)", "group size"] if bisect else []), "cost (dB)",
               "gain (dB)", "CPU cost (dB)", "CPU gain (dB)", "HTP SQNR (dB)", "local drop (dB)", "CPU qdq SQNR (dB)",
               "CPU xmodel SQNR (dB)", "weight SQNR (dB)"]
    lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    keys = [*(["group_gain_db", "group_size"] if bisect else []), "cost_db", "gain_db", "cpu_cost_db", "cpu_gain_db",
            "htp_sqnr_db", "local_drop_db", "cpu_qdq_sqnr_db", "cpu_xmodel_sqnr_db", "weight_sqnr_db"]
    for r in result["tensors"]:
        cells = [str(r["rank"]), f"`{r['tensor']}`", r["op_type"]]
        for key in keys:
            value = r.get(key)
            cells.append("–" if value is None else str(value) if key == "group_size" else f"{value:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    if result.get("groups"):
        lines += ["", "Groups measured on the emulator (graph order; what the group alone at 16 bit gains, every other "
                      "candidate at 8):", "", "| first tensor | last tensor | size | gain (dB) |", "|---|---|---|---|"]
        for g in result["groups"]:
            lines.append(f"| `{g['tensors'][0]}` | `{g['tensors'][-1]}` | {g['size']} | {g['gain_db']:.2f} |")
    lines += ["", f"![sensitivity]({Path(result['graph']).name}.sensitivity.png)", ""]
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["tensors"][:PLOTTED]
    bisect = result.get("search", "bisect") != "exhaustive"
    labels = [r["tensor"].strip("/").replace("_output_0", "")[-28:] for r in rows]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(rows) + 2), 4.2))
    x = list(range(len(rows)))
    bars = [("group_gain_db", "gain of its group at 16 bit, emulator (dB)")] if bisect else []
    bars += [("cost_db", "cost of 8 bit, emulator (dB)"), ("gain_db", "gain of 16 bit alone, emulator (dB)"),
             ("cpu_gain_db", "gain of 16 bit alone, CPU (dB)")]
    width = 0.8 / len(bars)
    for k, (key, label) in enumerate(bars):
        ax.bar([i - 0.4 + width * (k + 0.5) for i in x], [r.get(key) or 0.0 for r in rows], width=width, label=label)
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize="x-small")
    ax.axhline(0, color="black", linewidth=0.5)
    ax.set_ylabel("worst-output SQNR change (dB)")
    shown = f"top {len(rows)} of {len(result['tensors'])}" if len(rows) < len(result["tensors"]) else "per tensor"
    ax.set_title(f"{result['graph']} / {result['variant']} on {result['chip']}: sensitivity, {shown}")
    ax.legend(fontsize="small")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)

"""Per-layer weight bits for `doit tune` (not a stage): when the whole LPBQ int4 rung misses a graph's target, keep
the fewest weights at int8 that make it meet, the rest LPBQ int4 (issue 30: "8 bits where it matters").

1. Rank (CPU, seconds): each weight alone quantized as the rung would (LPBQ blocks where its input channels divide,
   else int4 per channel), every other weight float; onnxruntime's CPU session on the tuning samples; the lowest
   output cosine against the float reference. Lowest first = most harm at 4 bit. As cpu_ranking.py's numbers, these
   only order the emulator's work: they never decide a result.
2. Search (emulator): the top k weights at int8 (a weight override each), with the ladder's own quantize / compile /
   measure on the tuning chip. The largest k worth trying is the largest whose binary is still smaller than the
   graph's W8A8 one (the next rung: past that size it is the smaller candidate; found by compiling, without the
   emulator); if that k misses, the search stops; else the smallest k that meets is bisected, assuming one more int8
   weight never hurts accuracy. Size is another matter: a larger k already compiled whose binary came out smaller
   is measured too and kept if it meets (_smaller_still). Each probe is judged on the tuning samples, then the full
   evaluation set.
Graphs are searched one by one (their quantization is independent); a graph the LPBQ rung already meets keeps k = 0.
"""
from __future__ import annotations

import time

from ...quantization.block_quant import BLOCKED_OPS, lpbq_params, why_unblockable
from ...quantization.quant_spec import QuantSpec

WEIGHT_OPS = (*BLOCKED_OPS, "Conv")  # the layers whose weights the rung makes int4


def fake_quantized(node, w, block: int):
    """The float values of weight `w` (numpy) of `node` as the LPBQ rung stores it (block_quant.apply_lpbq): LPBQ in
    blocks of `block` input channels where they divide (MatMul, Gemm, 1x1 Conv2d), else symmetric int4 per output
    channel."""
    import numpy as np
    transposed = node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute)
    group = next((a.i for a in node.attribute if a.name == "group"), 1)
    if node.op_type == "Conv" and w.ndim == 4 and w.shape[2:] == (1, 1) and group == 1:
        m = w.reshape(w.shape[:2]).T  # [IC, OC]
    else:
        m = None if node.op_type == "Conv" or w.ndim != 2 else (w.T if transposed else w)  # [K input channels, N]
    if m is not None and why_unblockable(m.shape[0], block) is None:
        q, ints, scale = lpbq_params(m, block)
        k = m.shape[0]
        deq = (q.reshape(k // block, block, -1) * (ints * scale)[:, None, :]).reshape(m.shape).astype(np.float32)
        if node.op_type == "Conv":
            return np.ascontiguousarray(deq.T).reshape(w.shape)
        return deq.T if transposed else deq
    axis = 0 if node.op_type == "Conv" or transposed else w.ndim - 1  # the output channels
    moved = np.moveaxis(w, axis, 0)
    scale = np.maximum(np.abs(moved).reshape(moved.shape[0], -1).max(axis=1) / 7.0, 1e-12)
    scale = scale.reshape(-1, *[1] * (moved.ndim - 1))
    return np.moveaxis(np.clip(np.round(moved / scale), -8, 7) * scale, 0, axis).astype(np.float32)


def rank(float_onnx: str, inputs: list[dict], reference: list[dict], block: int, skip=()) -> list[tuple[str, float]]:
    """[(node, lowest output cosine with that weight alone at 4 bit)], lowest first: the layers with a constant
    weight (after qnn_preprocess_model, whose node names weight_overrides use), except `skip`."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    from ...measuring.samples import compare
    from ...toolchains import ort_qnn
    model = ort_qnn.preprocessed_model(float_onnx)
    inits = {i.name: i for i in model.graph.initializer}
    outputs = [o.name for o in model.graph.output]

    def lowest_cosine() -> float:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        runs = [dict(zip(outputs, session.run(outputs, x))) for x in inputs]
        return min(m["cosine"] for m in compare(reference, runs).values())

    ranked = []
    for node in model.graph.node:
        if node.op_type not in WEIGHT_OPS or len(node.input) < 2 or node.input[1] not in inits or node.name in skip:
            continue
        weight = inits[node.input[1]]
        kept = onnx.TensorProto()
        kept.CopyFrom(weight)
        values = numpy_helper.to_array(weight)
        if values.dtype != np.float32:
            continue
        weight.CopyFrom(numpy_helper.from_array(fake_quantized(node, values, block), weight.name))
        ranked.append((node.name, lowest_cosine()))
        weight.CopyFrom(kept)
    return sorted(ranked, key=lambda pair: pair[1])


def search(ladder, base: dict, ceiling: dict, order: list[str], log) -> dict:
    """The per-layer rung: `base` is the whole LPBQ rung ({"name", "changes"}; its "graphs" hold what the ladder built
    and measured of it, if it was tried), `ceiling` the 8-bit rung whose binary size bounds the search. Returns a
    rung record ({"name", "changes", "weight_bits": {graph: [nodes at int8]}, "graphs", "probes", "met"}) that
    tune_ladder lists, and chooses when every graph met."""
    started = time.perf_counter()
    rung = {"name": f"{base['name']}_int8_layers", "changes": base["changes"], "weight_bits": {}, "graphs": {},
            "probes": [], "met": True}
    for name in order:
        graph = ladder._graph(name)
        found = _graph_search(ladder, base, ceiling, graph, rung, log) if name in ladder.candidates else None
        if found is None and name in ladder.candidates:
            rung["met"] = False
            break
        if found is None:  # no target: only its size counts
            tried = base.get("graphs", {}).get(name) or {}
            found = ([], dict(tried) if "bytes" in tried else ladder.build_graph(base, graph))
            if "error" in found[1]:
                rung["met"] = False
        rung["weight_bits"][name], rung["graphs"][name] = found
    rung["seconds"] = round(time.perf_counter() - started, 1)
    return rung


def _graph_search(ladder, base: dict, ceiling: dict, graph: dict, rung: dict, log):
    """The smallest k whose top-k int8 probe meets the graph's target: (nodes, its built record), or None."""
    from .precision import meets
    name = graph["name"]
    ranked: list[str] = []

    def trial(k: int) -> dict:  # a name per k: the ladder compiles each once (sizing, then probing, reuse it)
        return {"name": f"{rung['name']}_{name}_top{k}", "changes": base["changes"],
                "weight_bits": {name: ranked[:k]}, "graphs": {}}

    def built(k: int) -> dict:
        return ladder.build_graph(trial(k), graph)

    def probe(k: int) -> bool:
        tried = trial(k)
        ok = ladder.try_rung(tried, [name])
        screened = tried["graphs"].get(name, {})  # a probe the CPU ruled out: its CPU numbers, no emulator's
        rung["probes"].append({"graph": name, "int8": k, "meets": ok, **{key: built(k)[key] for key in (
            "bytes", "subset", "full", "error") if key in built(k)},
            **{key: screened[key] for key in ("ruled_out", "cpu") if key in screened}})
        return ok

    tried = base.get("graphs", {}).get(name) or {}
    if "error" in tried:
        return None
    known = tried.get("missed")  # set when the whole rung is the variant itself, measured as it is
    if known is False or (known is None and tried.get("full") and meets(graph["target"], tried["full"])):
        return [], tried if "bytes" in tried else {**ladder.build_graph(base, graph), "full": tried["full"]}
    missed = known or "ruled_out" in tried or any(tried.get(s) and not meets(graph["target"], tried[s]) for s in ("subset", "full"))
    if not missed and probe(0):  # not known to miss: measured as it is first
        return [], built(0)
    spec = QuantSpec.from_settings(graph["variant"])
    c = ladder.candidates[name]
    eight = {n for n, t in spec.weight_overrides.items() if t != "int4"}  # already 8 bit by the variant
    scored = rank(graph["onnx"], [c.inputs[i] for i in c.subset], [c.reference[i] for i in c.subset],
                  base["changes"]["block_size"], skip=eight)
    rung.setdefault("ranked", {})[name] = [[n, round(cos, 6)] for n, cos in scored]
    log(f"ladder {rung['name']}: {name}: {len(scored)} weights ranked on the CPU (each alone at 4 bit, lowest output "
        "cosine): " + ", ".join(f"{n} {cos:.4f}" for n, cos in scored[:5]) + (" ..." if len(scored) > 5 else ""))
    ranked[:] = [n for n, _ in scored]
    limit = ladder.build_graph(ceiling, graph).get("bytes")  # the 8-bit rung's binary (that rung reuses it)
    rung.setdefault("ceiling_bytes", {})[name] = limit
    high = _largest_below(lambda k: built(k).get("bytes"), len(ranked), limit)  # compiles only
    if high == 0:
        log(f"ladder {rung['name']}: {name}: one weight at int8 already makes a binary as large as {ceiling['name']}'s "
            f"({limit} bytes): no per-layer mix tried")
        return None
    if not probe(high):
        log(f"ladder {rung['name']}: {name}: misses with its {high} most harmed weights of {len(ranked)} at int8 "
            f"(more would make a binary as large as {ceiling['name']}'s)")
        return None
    low = 0  # the whole LPBQ rung: missed
    while high - low > 1:
        middle = (low + high) // 2
        if probe(middle):
            high = middle
        else:
            low = middle
    best = _smaller_still(high, ladder, trial, probe, rung, name, log)
    return ranked[:best], built(best)


def _smaller_still(k: int, ladder, trial, probe, rung: dict, name: str, log) -> int:
    """`k`, or a larger k already compiled (sizing, probing) whose binary is smaller and that meets too: binary size
    is not monotonic in the weights kept at int8 (PP-OCRv4's recogniser: 25 convolutions at int8 3244.0 KB, 29 at
    3194.9 KB), so the fewest int8 weights need not be the smallest binary. Each such k costs one measurement."""
    def size(j: int):
        return ladder._built.get((trial(j)["name"], name), {}).get("bytes")
    best = k
    for j in sorted((j for j in range(k + 1, len(ranked_of(rung, name)) + 1) if size(j) is not None), key=size):
        if size(j) >= size(best):
            break
        log(f"ladder {rung['name']}: {name}: top {j} at int8 compiled to {size(j) / 1e3:.1f} KB, smaller than top "
            f"{best}'s {size(best) / 1e3:.1f} KB: measured too")
        known = next((p["meets"] for p in rung["probes"] if p["graph"] == name and p["int8"] == j), None)
        if known if known is not None else probe(j):
            best = j
            break
    return best


def ranked_of(rung: dict, graph: str) -> list:
    return rung.get("ranked", {}).get(graph, [])


def _largest_below(size, count: int, limit: int | None) -> int:
    """The largest k in [0, count] whose size(k) is under `limit` (sizes grow with k; no limit: count). A k that
    does not build counts as too large."""
    if limit is None:
        return count
    low, high = 0, count + 1  # size(low) < limit (k = 0 is the LPBQ rung, smaller), size(high) >= limit
    while high - low > 1:
        middle = (low + high) // 2
        bytes_ = size(middle)
        if bytes_ is not None and bytes_ < limit:
            low = middle
        else:
            high = middle
    return low

"""A binary that does not repeat itself on the emulator (repeats.py): where the differences start, and a precision
that repeats (not a stage: the check, diagnose and tune call it).

locate(): the variant's QDQ model (the float model for fp16) with its activation tensors exposed (diagnose's Graph)
is compiled in-process for the chip and run RUNS times on one sample in one session, and on while no run differs
from the first, up to as many pairs as the check asks (16): four runs of a model whose runs differ one time in three
all agree with probability (2/3)^3, 30 %, and the session would be called one that repeats itself. A tensor whose
bytes differ between the runs while the exposed tensors it is computed from do not is where a difference starts (a
source).
Exposing tensors changes what the HTP fuses, so these are the exposed model's sources; the plain binary's may sit
inside a fused group. Measured on YOLOv8n w8a16 (three sessions): the sources moved between sessions (SiLU Muls,
a Conv, a Resize, a Concat, all at the 10x10 stage), and no single op at 8 bit made the binary repeat itself.

repeatable(): what a candidate precision gives on the emulator: whether it repeats itself, judged on as many pairs
of runs as the build's check asks of a binary (repeats.samples_to_check(), 16), and how far its first run is from
the float model. (It ran each sample 3 times: 8 pairs on 4 samples, which a candidate varying as often as YOLOv8n's
binary does passes by chance with probability (2/3)^8, 4 %; with 16 pairs, 0.2 %, as the check.) Diagnose tries
candidates from the sources outwards and names the first that repeats (measured on YOLOv8n: the 7 source nodes of
three sessions at 8 bit still varied, so did the 18 nodes of the sources' exact shape; the 61 nodes at the 10x10
stage at 8 bit repeated themselves, as did every Conv or every Mul there; w8a8 always did).
"""
from __future__ import annotations

RUNS = 4  # runs of one sample in one session, at least: on YOLOv8n w8a16 two runs differ with probability ~1/3


def locate(graph, tensors: list, feed: dict, chip: dict, fp16: bool, runs: int = RUNS,
           pairs: int | None = None) -> dict:
    """{"runs", "exposed", "varying", "repeats", "sources": [{"tensor", "node", "op_type", "bits", "spread"}] in
    graph order, "outputs": {final output: spread}}: the model with `tensors` exposed run `runs` times on `feed`, and
    on while every run equals the first, until there are `pairs` later runs (default: as many pairs as the build's
    check asks of a binary)."""
    from ...emulator import emulator_runs
    from ...emulator.repeats import DEFAULT_SAMPLES, difference, samples_to_check
    from ...toolchains import ort_qnn
    pairs = pairs if pairs is not None else (samples_to_check() or DEFAULT_SAMPLES)  # 0 (checks off): the default
    model = graph.exposed_model(tensors)
    with emulator_runs.holding_slot(pin=True):  # on the slot's core, as a worker's session (emulator_runs.py)
        session = ort_qnn.emulator_session(model.SerializeToString(), soc_model=chip["soc_id"],
                                           vtcm_mb=chip["vtcm_mb"], fp16=fp16)
        names = [o.name for o in session.get_outputs()]
        outputs = [dict(zip(names, session.run(names, feed))) for _ in range(runs)]

        def differs(run: dict) -> bool:
            return any(difference(outputs[0][n], run[n]) for n in names)
        seen = any(differs(o) for o in outputs[1:])
        while not seen and len(outputs) <= pairs:  # nothing differed yet: not "repeats" on fewer pairs than a check's
            outputs.append(dict(zip(names, session.run(names, feed))))
            seen = differs(outputs[-1])
    runs = len(outputs)
    varying = {}
    for tensor in tensors:
        values = [o[tensor.output] for o in outputs]
        steps = max(difference(values[0], v) for v in values[1:])
        if steps > 0:  # in real units: a quantized tensor's integer steps times its scale
            varying[tensor.float_name] = steps * (float(tensor.scale) if tensor.scale is not None else 1.0)
    upstream = graph.sources([t.float_name for t in tensors])
    sources = [{"tensor": t.float_name, "node": t.node, "op_type": t.op_type, "bits": t.bits,
                "spread": varying[t.float_name]}
               for t in tensors if t.float_name in varying and not any(u in varying for u in upstream[t.float_name])]
    final = {name: max(difference(outputs[0][name], o[name]) for o in outputs[1:]) for name in graph.final}
    return {"runs": runs, "exposed": len(tensors), "varying": len(varying), "repeats": not varying,
            "sources": sources, "outputs": final}


def where(found: dict) -> str:
    """One clause for a message: where the differences start, or why no op is named."""
    if found["repeats"]:
        return (f"the model with its {found['exposed']} tensors exposed repeated itself over {found['runs']} runs "
                "of one sample: the differences start inside ops the HTP fuses, which exposing splits, so no op is "
                "named")
    first = found["sources"][0]
    more = found["sources"][1:4]
    others = (f"; they also start at {', '.join(repr(s['node']) + ' (' + s['op_type'] + ')' for s in more)}"
              + (f" and {len(found['sources']) - 4} more" if len(found["sources"]) > 4 else "")) if more else ""
    return (f"it starts at node {first['node']!r} ({first['op_type']}, {first['bits']}-bit output, varying by up to "
            f"{first['spread']:.4g}): the first of {len(found['sources'])} node(s) whose outputs varied while their "
            f"inputs did not ({found['varying']} of {found['exposed']} exposed tensors varied over {found['runs']} "
            f"runs of one sample){others}")


def repeatable(model: bytes, samples: list[dict], reference: list[dict], chip: dict, fp16: bool = False,
               pairs: int | None = None) -> dict:
    """{"repeats", "runs" (of each sample), "pairs" (each later run against its sample's first), "spread": {output:
    largest difference}, "cosine": worst output's cosine of the first run against `reference` (the float model's
    outputs)} of a float or QDQ model compiled in-process, its samples run in one session until there are `pairs`
    (default: as many as the build's check asks) and at least 2 runs each; {"not_built": QNN's error} when it does not
    compile."""
    from ...emulator import emulator_runs
    from ...emulator.repeats import DEFAULT_SAMPLES, difference, samples_to_check
    from ...measuring.samples import compare
    from ...toolchains import ort_qnn
    pairs = pairs if pairs is not None else (samples_to_check() or DEFAULT_SAMPLES)  # 0 (checks off): the default
    runs = 1 + max(1, -(-pairs // len(samples)))
    # on the slot's core, as a worker's session: unpinned, the emulator's threads spread over every core and took
    # twice the CPU for a longer wall time (docs/benchmarks.md, "Emulator sessions and cores")
    with emulator_runs.holding_slot(pin=True):
        try:
            session = ort_qnn.emulator_session(model, soc_model=chip["soc_id"], vtcm_mb=chip["vtcm_mb"], fp16=fp16)
        except Exception as e:  # onnxruntime raises its own exception types
            return {"not_built": str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__}
        names = [n for n in reference[0]]
        first, spread = [], {n: 0.0 for n in names}
        for feed in samples:
            outputs = [dict(zip(names, session.run(names, feed))) for _ in range(runs)]
            first.append(outputs[0])
            for name in names:
                spread[name] = max([spread[name]] + [difference(outputs[0][name], o[name]) for o in outputs[1:]])
    compared = compare(reference, first)
    return {"repeats": not any(spread.values()), "runs": runs, "pairs": len(samples) * (runs - 1), "spread": spread,
            "cosine": min(v["cosine"] for v in compared.values()), "sqnr": min(v["sqnr"] for v in compared.values())}


def candidates(graph_model, sources: list[dict], activation_bits: int) -> list[tuple[str, dict]]:
    """Precisions to try, smallest change first, as (description, node_overrides at 8 bit): the source nodes; every
    node whose output has the shape of a source's (the stage of the network they sit in); and every activation at
    8 bit (None: the variant with activations = "uint8"). Only for 16-bit activations (8 bit was always seen to
    repeat itself)."""
    if activation_bits != 16:
        return []
    import onnx
    inferred = onnx.shape_inference.infer_shapes(graph_model)
    # the stage of the network a tensor is in: an image's height and width (NCHW), else its whole shape
    shapes = {v.name: _stage(tuple(d.dim_value for d in v.type.tensor_type.shape.dim))
              for v in [*inferred.graph.value_info, *inferred.graph.output]}
    producer = {o: n for n in graph_model.graph.node for o in n.output}
    found = []
    nodes = sorted({s["node"] for s in sources if s["node"] in {n.name for n in graph_model.graph.node}})
    if nodes:
        found.append((f"the {len(nodes)} source node(s) at 8 bit", {n: "uint8" for n in nodes}))
        stage = {shapes[s["tensor"]] for s in sources if shapes.get(s["tensor"])}
        same = sorted({producer[name].name for name, shape in shapes.items() if shape in stage and name in producer
                       and producer[name].name})
        if same and set(same) != set(nodes):
            described = ", ".join("x".join(map(str, s)) for s in sorted(stage))
            found.append((f"the {len(same)} node(s) at a source's stage of the network (outputs of {described}) at "
                          "8 bit", {n: "uint8" for n in same}))
    found.append(("every activation at 8 bit", None))
    return found


def _stage(shape: tuple) -> tuple:
    """(height, width) of an NCHW activation: the tensors at one resolution of a CNN; other ranks, the shape."""
    return shape[2:] if len(shape) == 4 else shape


def examine(params: dict, graph, tensors: list, samples: list[dict], reference: list[dict], plain: list) -> dict | None:
    """Diagnose's part: None when the plain binary repeated itself on the diagnosed samples (and its record has no
    difference), else {"found": what its runs showed, "located": locate() of two sessions, "sources": their union in
    graph order, "fixes": each candidate tried (candidates()) with repeatable()'s numbers, up to the first that repeats
    itself}. params: diagnose's (chip, variant, onnx, ranges, tied, ctx_model). reference: the float model's final
    outputs on `samples`."""
    from ...emulator import emulator_runs, repeats
    found = repeats.shown(plain)
    unstable = emulator_runs.repeat_record(params["ctx_model"])["unstable"]
    if (found is None or found["repeats"] is not False) and unstable is None:
        return None
    fp16 = params["variant"]["precision"] == "fp16"
    located = [locate(graph, tensors, samples[0], params["chip"], fp16) for _ in range(2)]  # sources move: 2 sessions
    seen, sources = set(), []
    order = {t.float_name: i for i, t in enumerate(tensors)}
    for source in sorted((s for found_ in located for s in found_["sources"]), key=lambda s: order[s["tensor"]]):
        if source["node"] not in seen:
            seen.add(source["node"])
            sources.append(source)
    fixes = []
    if not fp16 and params.get("ranges"):
        for description, nodes in candidates(graph.float_model, sources, params["variant"]["activation_bits"]):
            print(f"instability: trying {description} ...", flush=True)
            tried = repeatable(_requantized(params, nodes), samples, reference, params["chip"])
            fixes.append({"description": description, "node_overrides": nodes, **tried})
            print(f"instability: {description}: " + ("not built: " + tried["not_built"] if "not_built" in tried else
                  f"{'repeats itself' if tried['repeats'] else 'still varies'}, cosine {tried['cosine']:.5f}"),
                  flush=True)
            if tried.get("repeats"):
                break
    return {"found": found or {"repeats": False, "first": {"sample": None, **unstable}}, "located": located,
            "sources": sources, "fixes": fixes}


def _requantized(params: dict, nodes: dict | None, **changes) -> bytes:
    """The variant's QDQ model again (onnxruntime's quantizer, from the shared ranges) with `nodes` at 8 bit, or every
    activation at 8 bit when None; `changes` to its spec on top (weights="uint16", ...)."""
    import tempfile
    from pathlib import Path

    from ...quantization.quant_spec import QuantSpec
    from ..quantize import write_qdq
    spec = QuantSpec.from_settings(params["variant"]).replace(quantizer="ort", techniques=(), technique_params={})
    spec = spec.replace(activations="uint8") if nodes is None else \
        spec.replace(node_overrides={**spec.node_overrides, **nodes})
    spec = spec.replace(**changes)
    with tempfile.TemporaryDirectory(prefix="instability-") as work:
        path = Path(work, "candidate.qdq.onnx")
        write_qdq(spec, params["onnx"], path, [], ranges=params["ranges"],
                  tied=[tuple(p) for p in params.get("tied") or []] or None)
        return path.read_bytes()


def fix_lines(params: dict, fix: dict) -> str:
    """The model.toml lines of a candidate that repeated itself."""
    if fix["node_overrides"] is None:
        return (f'[variants.{params["variant_name"]}]\nactivations = "uint8"   # then `doit tune` puts back at 16 bit '
                "what the gates need, each candidate checked for repeating")
    own = dict(params["variant"].get("graph_overrides", {}).get("node_overrides", {}))
    own.update(fix["node_overrides"])
    body = ", ".join(f'"{n}" = "{q}"' for n, q in own.items())
    return f"[variants.{params['variant_name']}.graphs.{params['graph_name']}]\nnode_overrides = {{ {body} }}"


def words(params: dict, examined: dict) -> list[str]:
    """Diagnose's lines on a binary that does not repeat itself: the spread, where it starts, the fix measured."""
    from ...emulator.repeats import describe
    found = examined["found"]
    spread = describe(found) if found.get("samples") else (
        f"its record says output {found['first']['output']!r} differed by up to {found['first']['spread']:.4g}")
    lines = [f"The binary does not repeat itself on the emulator: {spread}. Every number below is one run of many "
             "(the exposure check cannot be judged); its check fails for it."]
    lines += [f"Session {i + 1}: {where(found_)}." for i, found_ in enumerate(examined["located"])]
    fixes = examined["fixes"]
    good = [f for f in fixes if f.get("repeats")]
    tried = "; ".join(f"{f['description']}: " + ("not built" if "not_built" in f else
                                                  "repeats itself" if f["repeats"] else
                                                  f"still varies (by up to {max(f['spread'].values()):.4g})")
                      for f in fixes)
    if good:
        fix = good[0]
        lines.append(f"Measured on the diagnosed samples, each run {fix['runs']} times in one session ({fix['pairs']} "
                     f"pairs of runs, as many as a build's check compares): {tried}. "
                     f"Fix: {fix['description']} (cosine {fix['cosine']:.5f} against float, SQNR {fix['sqnr']:.1f} dB "
                     f"on the first run); in model.toml:\n{fix_lines(params, fix)}")
    elif fixes:
        lines.append(f"Measured: {tried}; none repeated itself.")
    elif params["variant"].get("precision") == "fp16":
        lines.append("No precision to try for an fp16 binary: report it upstream (QNN, the HTP emulator) with the "
                     "binary and this sample.")
    return lines


def compiles(params: dict, **changes) -> dict:
    """Whether the variant with `changes` (e.g. weights="uint16") compiles for the chip, checked before diagnose
    suggests it: {"compiles": bool, "error": QNN's first line}. (16-bit weights do not compile for a Conv on any chip
    with onnxruntime-qnn 2.7.0: "Node '...Conv_token_9' OpType:Conv ... was not selected by that EP"; diagnose once
    suggested them.)"""
    from ...emulator import emulator_runs
    from ...toolchains import ort_qnn
    model = _requantized(params, {}, **changes)
    with emulator_runs.holding_slot():
        try:
            ort_qnn.emulator_session(model, soc_model=params["chip"]["soc_id"], vtcm_mb=params["chip"]["vtcm_mb"])
        except Exception as e:  # onnxruntime raises its own exception types
            text = str(e).strip()
            return {"compiles": False, "error": (text.splitlines()[0] if text else type(e).__name__)[:300]}
    return {"compiles": True}

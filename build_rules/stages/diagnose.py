"""diagnose (ort-qnn, `doit diagnose:<model>/<graph>/<variant>@<chip>`): where a binary loses accuracy, by tensor.

The field report's advice (5.3), built in: the variant's QDQ model (the float model for fp16) with its activation
tensors exposed as extra outputs is compiled in-process for the chip and run on the HTP emulator over a few
evaluation samples, and the same model runs on the CPU. Per tensor, in graph order:
- binary vs CPU: SQNR and cosine of the emulator's tensor against the CPU QDQ model's (fp16: against the float model):
  a drop here that the CPU model does not have is an HTP-only divergence;
- CPU vs float: the CPU QDQ model against the float model (what quantization costs); a drop here is a
  precision or range problem that a 16-bit override or the export fixes.
Each curve's first drop (the first tensor below the floor of the variant's bits that loses >= DROP_DB itself; for
binary vs CPU, only where the binary is also farther from float than the CPU model) is named with its op and node,
then the likely fix in words (stages/support/diagnosis.py): the `overrides` line to keep tensors at 16 bit, the
`weight_overrides` line to keep a layer's int4 weight at 8 bit when the loss is its weight's, a range problem,
a 16-bit variant, the fp16 range problem at that op (stages/fp16_lint.py), or an HTP-only divergence to report
upstream. Writes <graph>.diagnose.md, .png and .json.

What is exposed: the integer output of each activation QuantizeLinear of the variant's own QDQ model, as the
quantize stage wrote it (dequantized here with its scale and zero point). Not ort_qnn.quantize(extra_outputs=...),
which sensitivity's _htp_profile uses: that quantizes the float model again with the tensors as graph outputs, a
model other than the one the binary was compiled from.

Exposing a tensor can change what HTP computes: a tensor between a Conv and the activation HTP fuses into it
(Relu, PRelu, ...) would have to be requantized where the plain binary never does (measured on MTCNN O-Net, w8a8:
final outputs 1-4 quantization steps apart). Those tensors are not exposed (the activation's output is), and the
exposed run's final outputs are compared with the plain binary's on the same samples: the report says whether
they are bit-identical, and if not by how much, next to the size of the problem found.
"""
from __future__ import annotations

import math
import time

from ..errors import BuildError
from ..plumbing.files import atomic_write_json, atomic_write_text
from .support.diagnosis import CAP_DB, DROP_DB, FLOOR_DB, HTP_WORSE_DB, OWN_DROP_DB

SAMPLES = 4  # evaluation samples, evenly spaced over the set: the emulator with every tensor exposed is slow
# More activation tensors than this: every Nth is exposed. Measured on PP-OCRv4's recogniser (340 tensors, w8a8,
# SM8750, a busy machine): compile with 341 outputs 30.8 s, 172 outputs 27.5 s, 87 outputs 8.0 s, the plain binary
# 24.6 s; 4 emulator runs 47.8 / 44.4 / 31.4 s. The runs cost more than the compile; past 1000 it is untried.
MAX_TENSORS = 1000
# HTP fuses these into the op that produces their input; exposing that input breaks the fusion (see above).
FUSED_ACTIVATIONS = {"Relu", "PRelu", "LeakyRelu", "Clip", "Relu6"}


def run(params: dict) -> dict:
    import numpy as np

    from ..measuring.samples import evenly_spaced, load_evaluation
    from ..toolchains import ort_qnn

    started = time.perf_counter()
    inputs, _ = load_evaluation(params["evaluation"])
    subset = evenly_spaced(len(inputs), params.get("samples") or SAMPLES)
    samples = [inputs[i] for i in subset]
    fp16 = params["variant"]["precision"] == "fp16"
    graph = Graph.load(params["onnx"], None if fp16 else params["qdq"])
    print(f"loaded the models in {time.perf_counter() - started:.1f} s", flush=True)
    exposed, every = graph.choose(params.get("max_tensors") or MAX_TENSORS)
    if not fp16:  # a tensor the quantizer made (none is known so far) has no float value to compare with
        known = graph.float_names()
        exposed = [t for t in exposed if t.float_name in known]
    print(f"{len(graph.tensors)} activation tensors, {len(exposed)} exposed (every {every}), "
          f"{len(samples)} samples ({', '.join(map(str, subset))}), chip {params['chip']['name']}", flush=True)
    model = graph.exposed_model(exposed)

    t = time.perf_counter()
    from ..emulator import emulator_runs
    try:  # across the emulator's workers, each compiling the model once
        emulated = emulator_runs.run_model_outputs(model.SerializeToString(), samples, soc_model=params["chip"]["soc_id"],
                                                   vtcm_mb=params["chip"]["vtcm_mb"], fp16=fp16)
    except emulator_runs.EmulatorCompileError as e:
        raise BuildError(f"{params['name']}: the model with {len(exposed)} tensors exposed as outputs does not "
                         f"compile for the emulator, though the plain one did: {e}") from None
    names = [o.name for o in model.graph.output]  # (the session's outputs, in order)
    emulator_seconds = time.perf_counter() - t
    print(f"compiled with {len(names)} outputs and ran {len(samples)} samples on the emulator in "
          f"{emulator_seconds:.1f} s", flush=True)
    lap = _Laps()
    ort = ort_qnn._ort()
    cpu_session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    cpu = [dict(zip(names, cpu_session.run(names, s))) for s in samples]
    lap("CPU QDQ model")
    floats = graph.float_values([t.float_name for t in exposed], samples) if not fp16 else cpu
    lap("float model")
    plain_outputs = emulator_runs.run_outputs(params["ctx_model"], samples, "plain binary samples")
    exposure = exposure_check(graph, emulated, plain_outputs)
    lap("plain binary")
    from .support import instability
    examined = instability.examine(params, graph, exposed, samples,
                                   [{n: f[n] for n in graph.final} for f in floats] if not fp16 else
                                   [{n: p[n] for n in graph.final} for p in graph.float_values([], samples)],
                                   plain_outputs)
    if examined is not None:  # the plain binary gives other outputs on another run: exposure cannot be judged
        exposure["identical"] = None
        lap("instability")
    weights16 = None
    if not fp16 and params["variant"]["activation_bits"] == 16 and params["variant"].get("weights") != "uint16" \
            and params.get("ranges"):  # advice diagnose may give: only if the HTP builds it
        weights16 = instability.compiles(params, weights="uint16")
        lap("16-bit weights compile" if weights16["compiles"] else "16-bit weights do not compile")

    rows = []
    for tensor in exposed:
        htp, on_cpu = tensor.values(emulated), tensor.values(cpu)
        row = {"tensor": tensor.float_name, "node": tensor.node, "op_type": tensor.op_type, "bits": tensor.bits,
               "weight": tensor.weight, "binary_vs_cpu": _compare(on_cpu, htp)}
        if not fp16:
            reference = _flat([f[tensor.float_name] for f in floats])
            row["cpu_vs_float"] = _compare(reference, on_cpu)
            row["binary_vs_float"] = _compare(reference, htp)
            row["range"] = tensor.range_report(reference)
        else:
            row["range"] = {"float": [float(np.min(on_cpu)), float(np.max(on_cpu))] if on_cpu.size else None}
        rows.append(row)
    if not fp16:  # a Concat's output slice by slice: one SQNR over it hides a crushed narrow input (issue 44)
        split_concats(graph, exposed, rows, emulated, cpu, floats)
    lap("comparisons")
    sources = graph.sources([t.float_name for t in exposed])
    floor = FLOOR_DB["fp16" if fp16 else params["variant"]["activation_bits"]]
    drops = {"binary_vs_cpu": find_drop(rows, sources, "binary_vs_cpu", floor, None if fp16 else _htp_worse)}
    if not fp16:
        drops["cpu_vs_float"] = find_drop(rows, sources, "cpu_vs_float", floor)
    lint = []
    if fp16:
        from .fp16_lint import lint as fp16_lint
        lint = fp16_lint(params["onnx"], samples)
    result = {"model": params["model"], "graph": params["graph_name"], "variant": params["variant_name"],
              "chip": params["chip"]["name"], "fp16": fp16, "samples": subset, "tensors_total": len(graph.tensors),
              "exposed": len(exposed), "every": every, "floor_db": floor, "rows": rows, "drops": drops,
              "exposure": exposure, "final": final_outputs(graph, plain_outputs, floats),
              "lint": lint, "check": check_measurement(params, len(inputs)), "instability": examined,
              "weights16": weights16,
              "seconds": {"emulator": round(emulator_seconds, 1),  # compile and runs, in the workers
                          "total": round(time.perf_counter() - started, 1)}}
    lap("drops and lint")
    from .support.diagnosis import clean, diagnose, markdown, plot
    result["diagnosis"] = diagnose(result, params)
    atomic_write_json(params["outputs"]["json"], clean(result))
    atomic_write_text(params["outputs"]["markdown"], markdown(result, params))
    plot(result, params["outputs"]["png"])
    lap("report")
    for line in result["diagnosis"]:
        print(line, flush=True)
    return {"first_drops": {c: (d or {}).get("tensor") for c, d in drops.items()}}


class _Laps:
    """Prints how long each part took (into the stage's log)."""

    def __init__(self):
        self.last = time.perf_counter()

    def __call__(self, what: str) -> None:
        now = time.perf_counter()
        print(f"{what}: {now - self.last:.1f} s", flush=True)
        self.last = now


# --- the graph's tensors ----------------------------------------------------------------------------------------

class Tensor:
    """One activation tensor: its name in the float model, the node and op that make it, how the exposed model
    gives it (a QuantizeLinear's integer output, or the float tensor itself for fp16) and how to read it back."""

    def __init__(self, float_name: str, output: str, node: str, op_type: str, bits, scale=None, zero=None,
                 dtype=None, weight: str | None = None):
        self.float_name, self.output, self.node, self.op_type, self.bits = float_name, output, node, op_type, bits
        self.scale, self.zero, self.dtype = scale, zero, dtype
        self.weight = weight  # the type of the weight its node reads ("int4", "uint8", ...), None without one

    def values(self, runs: list[dict]):
        """The tensor's real values over all runs (one output dict each), as _flat() strides them."""
        flat = _flat([run[self.output] for run in runs])
        return flat if self.scale is None else (flat - float(self.zero)) * float(self.scale)

    def arrays(self, runs: list[dict]) -> list:
        """The tensor's real values per run, in its shape."""
        import numpy as np
        if self.scale is None:
            return [np.asarray(run[self.output], dtype=np.float64) for run in runs]
        return [(np.asarray(run[self.output], dtype=np.float64) - float(self.zero)) * float(self.scale) for run in runs]

    def quantized_range(self) -> tuple[float, float] | None:
        import numpy as np
        if self.scale is None:
            return None
        info = np.iinfo(self.dtype)
        return (float(self.scale) * (info.min - float(self.zero)), float(self.scale) * (info.max - float(self.zero)))

    def range_report(self, reference) -> dict:
        """The float values' range on the samples against the calibrated (quantized) range: the share clipped, the
        share of the range used, and the values' RMS in quantization steps."""
        import numpy as np
        if not reference.size:
            return {}
        low, high = float(np.min(reference)), float(np.max(reference))
        report = {"float": [low, high]}
        q = self.quantized_range()
        if q is not None:
            step = float(self.scale)
            report.update(quantized=list(q), step=step,
                          clipped=float(np.mean((reference < q[0] - step / 2) | (reference > q[1] + step / 2))),
                          used=float((min(high, q[1]) - max(low, q[0])) / (q[1] - q[0])) if q[1] > q[0] else 0.0,
                          rms_steps=float(np.sqrt(np.mean(reference * reference)) / step) if step else None,
                          below_step=float(np.mean((np.abs(reference) < step) & (reference != 0))))
        return report


class Graph:
    """The model diagnose exposes: the QDQ model (quantized variants) or the float model (fp16), its activation
    tensors in graph order, and the float model (after qnn_preprocess_model, whose tensor names the QDQ model has)."""

    def __init__(self, model, float_model, tensors: list[Tensor], final: list[str]):
        self.model, self.float_model, self.tensors, self.final = model, float_model, tensors, final

    @classmethod
    def load(cls, float_path: str, qdq_path: str | None) -> "Graph":
        import onnx
        from ..toolchains import ort_qnn
        if qdq_path is None:
            model = onnx.load(str(float_path))
            return cls(model, model, _float_tensors(model), [o.name for o in model.graph.output])
        model = onnx.load(str(qdq_path))
        return cls(model, ort_qnn.preprocessed_model(float_path), _quantized_tensors(model),
                   [o.name for o in model.graph.output])

    def choose(self, limit: int) -> tuple[list[Tensor], int]:
        """The tensors to expose: all but those feeding a fused activation, every Nth of them past `limit` (the
        graph's outputs always)."""
        consumers = _consumers(self.model)
        readers = {}
        for t in self.tensors:
            ops = set()
            for node in consumers.get(t.output, []):
                if node.op_type == "DequantizeLinear":  # the QDQ model: look through the DQ
                    ops |= {n.op_type for n in consumers.get(node.output[0], [])}
                else:
                    ops.add(node.op_type)
            readers[t.float_name] = ops
        final = set(self.final)
        candidates = [t for t in self.tensors if not (readers[t.float_name] & FUSED_ACTIVATIONS)
                      or t.float_name in final]
        every = max(1, math.ceil(len(candidates) / limit))
        chosen = [t for i, t in enumerate(candidates) if i % every == 0 or t.float_name in final]
        return chosen, every

    def exposed_model(self, tensors: list[Tensor]):
        import onnx
        exposed = onnx.ModelProto()
        exposed.CopyFrom(self.model)
        have = {o.name for o in exposed.graph.output}
        for t in tensors:
            if t.output not in have:
                elem = onnx.helper.np_dtype_to_tensor_dtype(t.dtype) if t.dtype is not None else onnx.TensorProto.FLOAT
                exposed.graph.output.append(onnx.helper.make_tensor_value_info(t.output, elem, None))
        return exposed

    def float_names(self) -> set[str]:
        model = self.float_model
        return {o for n in model.graph.node for o in n.output} | {i.name for i in model.graph.input}

    def float_values(self, names: list[str], samples: list[dict]) -> list[dict]:
        """The float model's values of `names` (and its outputs) per sample, on the CPU."""
        from .fp16_lint import run_exposed
        return list(run_exposed(self.float_model, names, samples))

    def sources(self, measured: list[str]) -> dict[str, list[str]]:
        """measured tensor -> the nearest measured tensors it is computed from (through unmeasured ones)."""
        model = self.float_model
        producers = {o: n for n in model.graph.node for o in n.output}
        initializers = {i.name for i in model.graph.initializer}
        measured_set = set(measured)
        memo: dict[str, list[str]] = {}

        def upstream(name: str, depth: int = 0) -> list[str]:
            if name in memo:
                return memo[name]
            node = producers.get(name)
            found: list[str] = []
            if node is not None and depth < 200:
                for i in node.input:
                    if not i or i in initializers:
                        continue
                    found += [i] if i in measured_set else upstream(i, depth + 1)
            memo[name] = sorted(set(found))
            return memo[name]

        return {t: upstream(t) for t in measured}


def split_concats(graph: Graph, exposed: list[Tensor], rows: list[dict], emulated: list[dict], cpu: list[dict],
                   floats: list[dict]) -> None:
    """row["slices"] of each exposed Concat output: per input, its slice of the tensor against the float model's
    (CPU QDQ and binary), the float values' range on the samples in steps of the tensor's scale, and that input's
    own numbers when it is measured; with the graph output it is (or becomes through layout ops) and what an
    override names (stages/support/concat_slices.py). The likely fix reads them (support/diagnosis.py)."""
    import numpy as np
    from .support import concat_slices
    qdq = concat_slices.Qdq(graph.model)
    nodes = {n.name: n for n in graph.model.graph.node if n.op_type == "Concat"}
    by_name = {r["tensor"]: r for r in rows}
    shapes = None
    for tensor, row in zip(exposed, rows):
        node = nodes.get(tensor.node)
        if tensor.op_type != "Concat" or node is None or tensor.scale is None:
            continue
        shapes = concat_slices._shapes(graph.model) if shapes is None else shapes
        cut = concat_slices.layout(qdq, node, shapes)
        reference = [f[tensor.float_name] for f in floats]
        sizes = cut["sizes"] if None not in cut["sizes"] else None
        if sizes is None or sum(sizes) != np.shape(reference[0])[cut["axis"]]:
            continue
        on_cpu, htp = tensor.arrays(cpu), tensor.arrays(emulated)
        step, parts, start = float(tensor.scale), [], 0
        for name, size in zip(node.input, sizes):
            def part(arrays, start=start, size=size):
                return _flat([np.take(a, np.arange(start, start + size), axis=cut["axis"]) for a in arrays])
            values, tensor_name = part(reference), qdq.float_name(name)
            low, high = (float(np.min(values)), float(np.max(values))) if values.size else (0.0, 0.0)
            own = by_name.get(tensor_name)
            parts.append({"input": tensor_name or name, "source": qdq.source(tensor_name) if tensor_name else None,
                          "start": start, "stop": start + size, "range": [low, high], "steps": (high - low) / step,
                          "cpu_vs_float": _compare(values, part(on_cpu)),
                          "binary_vs_float": _compare(values, part(htp)),
                          "input_db": {c: own[c]["sqnr"] for c in ("cpu_vs_float", "binary_vs_float")} if own else None})
            start += size
        row["slices"] = {"axis": cut["axis"], "step": step, "type": str(np.dtype(tensor.dtype)), "output": cut["output"],
                         "parts": parts}


def _consumers(model) -> dict:
    consumers = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    return consumers


def _quantized_tensors(model) -> list[Tensor]:
    """Every activation QuantizeLinear of a QDQ model (not the converts between 8 and 16 bit), in graph order."""
    import numpy as np
    from onnx import numpy_helper
    from ..quantization.block_quant import weight_types
    producers = {o: n for n in model.graph.node for o in n.output}
    initializers = {i.name: i for i in model.graph.initializer}
    outputs = {o.name for o in model.graph.output}
    consumers = _consumers(model)
    weights = weight_types(model)  # node -> its weight's type ("int4", ...)
    tensors, seen = [], set()
    for node in model.graph.node:
        if node.op_type != "QuantizeLinear" or node.input[0] in initializers:
            continue
        source = producers.get(node.input[0])
        if source is not None and source.op_type == "DequantizeLinear":
            continue  # a convert (8 <-> 16 bit) of a tensor already listed
        if node.input[1] not in initializers or len(node.input) < 3 or node.input[2] not in initializers:
            continue
        scale = numpy_helper.to_array(initializers[node.input[1]])
        zero = numpy_helper.to_array(initializers[node.input[2]])
        if scale.size != 1:
            continue
        name = node.input[0]
        # The quantizer renames a graph output's producer output to <output>_QuantizeLinear_Input
        dq = [c for c in consumers.get(node.output[0], []) if c.op_type == "DequantizeLinear"]
        if name.endswith("_QuantizeLinear_Input") and dq and dq[0].output[0] in outputs:
            name = dq[0].output[0]
        if name in seen:
            continue
        seen.add(name)
        node_name, op_type = (source.name, source.op_type) if source is not None else ("(graph input)", "input")
        tensors.append(Tensor(name, node.output[0], node_name, op_type, 8 * np.dtype(zero.dtype).itemsize,
                              scale.reshape(()), zero.reshape(()), zero.dtype, weights.get(node_name)))
    return tensors


def _float_tensors(model) -> list[Tensor]:
    from .fp16_lint import float_tensors
    producers = {o: n for n in model.graph.node for o in n.output}
    return [Tensor(t, t, producers[t].name or t, producers[t].op_type, "fp16") for t in float_tensors(model)]


# --- numbers ----------------------------------------------------------------------------------------------------

STRIDED = 1 << 18  # values per tensor compared (evenly strided over all samples' values): SQNR does not need more


def _flat(arrays: list):
    """One tensor's values over all samples as one float64 vector, every k-th of them past STRIDED values."""
    import numpy as np
    size = sum(np.size(a) for a in arrays)
    step = max(1, size // STRIDED)
    if step == 1:
        return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays]) if arrays else np.zeros(0)
    return np.concatenate([np.asarray(a).ravel() for a in arrays])[::step].astype(np.float64)


def _dot(a, b) -> float:
    # Not a @ b: OpenBLAS's threaded dot is ~50x slower than this on a busy 2-core machine (measured: 300 dots of
    # 2**18 values 5.1 s against 0.26 s), and diagnose makes three per tensor.
    import numpy as np
    return float(np.multiply(a, b).sum())


def _compare(reference, actual) -> dict:
    """SQNR (dB, capped at +-CAP_DB) and cosine of `actual` against `reference`, two vectors of the same values."""
    import numpy as np
    if not (np.isfinite(reference).all() and np.isfinite(actual).all()):
        lost = int(np.sum(np.isfinite(reference) != np.isfinite(actual)))
        if lost:  # inf/nan on one side only: the tensor is lost there (an fp16 overflow, a log(0))
            return {"sqnr": -CAP_DB, "cosine": 0.0, "max_abs": math.inf, "nonfinite": lost}
        keep = np.isfinite(reference)
        reference, actual = reference[keep], actual[keep]
    noise = reference - actual
    noise_power, signal = _dot(noise, noise), _dot(reference, reference)
    if noise_power == 0:
        sqnr = CAP_DB
    elif signal == 0:
        sqnr = -CAP_DB
    else:
        sqnr = max(min(10 * math.log10(signal / noise_power), CAP_DB), -CAP_DB)
    norms = math.sqrt(signal * _dot(actual, actual))
    cosine = _dot(reference, actual) / norms if norms > 0 else float(np.array_equal(reference, actual))
    return {"sqnr": round(sqnr, 3), "cosine": round(cosine, 6),
            "max_abs": float(np.max(np.abs(noise))) if noise.size else 0.0}


def _htp_worse(row: dict) -> bool:
    """The binary is farther from the float model than the CPU QDQ model is, by HTP_WORSE_DB: the difference between
    binary and CPU makes the tensor worse. (HTP fuses ops the CPU QDQ model requantizes between, e.g. Conv + PRelu:
    binary and CPU then differ by about the quantization noise itself, and the binary is the better of the two.)"""
    return row["binary_vs_float"]["sqnr"] < row["cpu_vs_float"]["sqnr"] - HTP_WORSE_DB


def find_drop(rows: list[dict], sources: dict, curve: str, floor: float, also=None) -> dict | None:
    """The first tensor (graph order) whose `curve` SQNR is below the floor (and meets `also`, if given) while its
    measured sources do not; its own drop (from its worst source) and the tensors after it that lose
    >= OWN_DROP_DB themselves below the floor."""
    value = {r["tensor"]: r[curve]["sqnr"] for r in rows}
    first, culprits, steepest = None, [], None
    for r in rows:
        v = value[r["tensor"]]
        before = [value[s] for s in sources.get(r["tensor"], []) if s in value]
        own = (min(before) if before else CAP_DB) - v
        r.setdefault("own_drop_db", {})[curve] = round(own, 3)
        if v >= floor or (also is not None and not also(r)):
            continue
        if steepest is None or own > steepest[1]:
            steepest = (r, own)
        if first is None and own >= DROP_DB:
            first = r
        if own >= OWN_DROP_DB:
            culprits.append(r["tensor"])
    if first is not None:
        culprits = [first["tensor"]] + [t for t in culprits[culprits.index(first["tensor"]) + 1:]]
    lowest = min(rows, key=lambda r: value[r["tensor"]]) if rows else None
    return {**(_where(first, value) if first else {"tensor": None}),
            "sources": sources.get(first["tensor"], []) if first else [],
            "own_drop_db": first["own_drop_db"][curve] if first else None, "culprits": culprits,
            "steepest": _where(steepest[0], value) if steepest else None,
            "lowest": _where(lowest, value) if lowest else None, "measured": len(rows), "below_floor": sum(
                value[r["tensor"]] < floor for r in rows)}


def _where(row: dict, value: dict) -> dict:
    return {"tensor": row["tensor"], "node": row["node"], "op_type": row["op_type"], "sqnr": value[row["tensor"]]}


def exposure_check(graph: Graph, emulated: list[dict], plain: list[dict]) -> dict:
    """The exposed model's final outputs on the emulator against the plain binary's, same samples."""
    import numpy as np
    worst, per_output = 0.0, {}
    for name in graph.final:
        a = np.concatenate([np.asarray(e[name], dtype=np.float64).ravel() for e in emulated])
        b = np.concatenate([np.asarray(p[name], dtype=np.float64).ravel() for p in plain])
        difference = float(np.max(np.abs(a - b))) if a.size else 0.0
        per_output[name] = {**_compare(b, a), "max_abs": difference}
        worst = max(worst, difference)
    return {"identical": worst == 0.0, "max_abs": worst, "outputs": per_output}


def check_measurement(params: dict, total: int) -> dict | None:
    """{"samples", "of", "partial", "outputs"} of the check stage's measurement of this very binary (its memo beside
    the binary; same binary, context model and evaluation file), else None. Diagnose runs a few samples: the report
    says when they miss what check measured (build_rules/stages/support/diagnosis.py). "samples" is how many check
    measured: all `total` of the evaluation set, or, when its gate failed early ("partial": true), the first k of
    them (stages/check.py measurement(): the memo then holds those k samples' metrics)."""
    import json
    from pathlib import Path

    from ..build_state import layout
    from ..build_state.hashing import file_digest
    ctx = str(params["ctx_model"])
    try:
        saved = json.loads(Path(layout.memo_file(ctx.replace("_ctx.onnx", ".check.json"))).read_text())
        key, metrics = saved["key"], saved["metrics"]
        same = (key.get("ctx_model"), key.get("binary"), key.get("evaluation")) == (
            file_digest(ctx), file_digest(ctx.replace("_ctx.onnx", ".bin")), file_digest(params["evaluation"]))
        partial = metrics.get("partial")
        samples = partial["samples"] if partial else metrics.get("samples")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not same:
        return None
    return {"samples": samples, "of": total, "partial": bool(partial), "outputs": metrics.get("outputs") or {}}


def final_outputs(graph: Graph, plain: list[dict], reference: list[dict]) -> dict:
    """The plain binary's final outputs against the float model's on the diagnosed samples (what the gate sees)."""
    return {name: _compare(_flat([r[name] for r in reference]), _flat([p[name] for p in plain])) for name in graph.final
            if name in reference[0]}

"""diagnose (ort-qnn, `doit diagnose:<model>/<graph>/<variant>@<chip>`): where a binary loses accuracy, by tensor.

The field report's advice (5.3), built in: the variant's QDQ model (the float model for fp16) with its activation
tensors exposed as extra outputs is compiled in-process for the chip and run on the HTP emulator over a few
evaluation samples, and the same model runs on the CPU. Per tensor, in graph order:
- binary vs CPU: SQNR and cosine of the emulator's tensor against the CPU QDQ model's (fp16: against the float model):
  a drop here that the CPU model does not have is an HTP-only divergence;
- CPU vs float: the CPU QDQ model against the float model (what quantization costs); a drop here is a
  precision or range problem that a 16-bit override or the export fixes.
The first tensor where each curve falls below its floor (its sources still above it) is named with its op and node,
then the likely fix in words: the `overrides` line to keep those tensors at 16 bit, the fp16 range problem at that
op (stages/fp16_lint.py), or an HTP-only divergence to report upstream. Writes <graph>.diagnose.md, .png and .json.

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
from pathlib import Path

from .. import progress
from ..errors import BuildError
from ..files import atomic_write_json, atomic_write_text

VERSION = 1
SAMPLES = 4  # evaluation samples, evenly spaced over the set: the emulator with every tensor exposed is slow
# More activation tensors than this: every Nth is exposed. Measured on PP-OCRv4's recogniser (340 tensors, w8a8,
# SM8750, a busy machine): compile with 341 outputs 30.8 s, 172 outputs 27.5 s, 87 outputs 8.0 s, the plain binary
# 24.6 s; 4 emulator runs 47.8 / 44.4 / 31.4 s. The runs cost more than the compile; past 1000 it is untried.
MAX_TENSORS = 1000
# HTP fuses these into the op that produces their input; exposing that input breaks the fusion (see above).
FUSED_ACTIVATIONS = {"Relu", "PRelu", "LeakyRelu", "Clip", "Relu6"}
# A tensor "drops" where its SQNR is below the floor of the variant's activation bits (16-bit activations: 8-bit
# weights keep a Conv's output near 35-40 dB) and it loses at least DROP_DB itself, from the worst tensor it is
# computed from: a curve that only declines a few dB an op has no first drop, the error builds up.
FLOOR_DB = {8: 20.0, 16: 30.0, "fp16": 40.0}
DROP_DB = 6.0
AMPLIFY_SMALL = {"Log", "Div", "Reciprocal", "Pow", "Sqrt"}  # ops whose output error grows as their input nears 0
WIDESPREAD = 0.25  # more than this share of the tensors below the floor: a variant-wide problem, not a few tensors
CAP_DB = 100.0  # SQNR of identical tensors (inf), for curves and arithmetic
OWN_DROP_DB = 3.0  # a tensor below the floor that loses at least this much itself (not only inherited) needs a fix
MAX_LISTED = 24  # tensors in the suggested overrides line


def run(params: dict) -> dict:
    import numpy as np

    from ..toolchains import ort_qnn
    from .common import load_evaluation
    from .precision import evenly_spaced

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
    try:
        session = ort_qnn.emulator_session(model.SerializeToString(), soc_model=params["chip"]["soc_id"],
                                           vtcm_mb=params["chip"]["vtcm_mb"], fp16=fp16)
    except Exception as e:  # onnxruntime raises its own exception types
        raise BuildError(f"{params['name']}: the model with {len(exposed)} tensors exposed as outputs does not "
                         f"compile for the emulator, though the plain one did: {type(e).__name__}: "
                         f"{str(e).strip()[:600]}") from None
    compile_seconds = time.perf_counter() - t
    names = [o.name for o in session.get_outputs()]
    t = time.perf_counter()
    emulated = [dict(zip(names, session.run(names, s))) for s in progress.track(samples, "emulator samples")]
    emulator_seconds = time.perf_counter() - t
    print(f"compiled with {len(names)} outputs in {compile_seconds:.1f} s; {len(samples)} emulator runs in "
          f"{emulator_seconds:.1f} s", flush=True)
    lap = _Laps()
    ort = ort_qnn._ort()
    cpu_session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    cpu = [dict(zip(names, cpu_session.run(names, s))) for s in samples]
    lap("CPU QDQ model")
    floats = graph.float_values([t.float_name for t in exposed], samples) if not fp16 else cpu
    lap("float model")
    plain = ort_qnn.open_context_binary(params["ctx_model"])
    plain_outputs = [plain(s) for s in samples]
    exposure = exposure_check(graph, emulated, plain_outputs)
    lap("plain binary")

    rows = []
    for tensor in exposed:
        htp, on_cpu = tensor.values(emulated), tensor.values(cpu)
        row = {"tensor": tensor.float_name, "node": tensor.node, "op_type": tensor.op_type, "bits": tensor.bits,
               "binary_vs_cpu": _compare(on_cpu, htp)}
        if not fp16:
            reference = _flat([f[tensor.float_name] for f in floats])
            row["cpu_vs_float"] = _compare(reference, on_cpu)
            row["binary_vs_float"] = _compare(reference, htp)
            row["range"] = tensor.range_report(reference)
        else:
            row["range"] = {"float": [float(np.min(on_cpu)), float(np.max(on_cpu))] if on_cpu.size else None}
        rows.append(row)
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
              "lint": lint, "seconds": {"compile": round(compile_seconds, 1), "emulator": round(emulator_seconds, 1),
                                        "total": round(time.perf_counter() - started, 1)}}
    lap("drops and lint")
    result["diagnosis"] = diagnose(result, params)
    atomic_write_json(params["outputs"]["json"], _clean(result))
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
                 dtype=None):
        self.float_name, self.output, self.node, self.op_type, self.bits = float_name, output, node, op_type, bits
        self.scale, self.zero, self.dtype = scale, zero, dtype

    def values(self, runs: list[dict]):
        """The tensor's real values over all runs (one output dict each), as _flat() strides them."""
        flat = _flat([run[self.output] for run in runs])
        return flat if self.scale is None else (flat - float(self.zero)) * float(self.scale)

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
    producers = {o: n for n in model.graph.node for o in n.output}
    initializers = {i.name: i for i in model.graph.initializer}
    outputs = {o.name for o in model.graph.output}
    consumers = _consumers(model)
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
                              scale.reshape(()), zero.reshape(()), zero.dtype))
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


HTP_WORSE_DB = 6.0  # the binary this much farther from float than the CPU QDQ model: an HTP-only loss


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


def final_outputs(graph: Graph, plain: list[dict], reference: list[dict]) -> dict:
    """The plain binary's final outputs against the float model's on the diagnosed samples (what the gate sees)."""
    return {name: _compare(_flat([r[name] for r in reference]), _flat([p[name] for p in plain])) for name in graph.final
            if name in reference[0]}


# --- the diagnosis ----------------------------------------------------------------------------------------------

def overrides_line(params: dict, tensors: list[str]) -> str:
    """The model.toml lines that keep `tensors` at 16 bit in this graph, merged with the graph's overrides."""
    own = dict(params["variant"].get("graph_overrides", {}).get("overrides", {}))
    own.update({t: "uint16" for t in tensors})
    body = ", ".join(f'"{t}" = "{q}"' for t, q in own.items())
    return f"[variants.{params['variant_name']}.graphs.{params['graph_name']}]\noverrides = {{ {body} }}"


def diagnose(result: dict, params: dict) -> list[str]:
    """The likely fix in words, from the drops."""
    rows = {r["tensor"]: r for r in result["rows"]}
    htp = result["drops"].get("binary_vs_cpu") or {}
    quant = result["drops"].get("cpu_vs_float") or {}
    floor = result["floor_db"]
    lines = []
    if result["fp16"]:
        if htp.get("tensor"):
            lines.append(f"The fp16 binary departs from the float model first at tensor '{htp['tensor']}' (node "
                         f"'{htp['node']}', {htp['op_type']}): {htp['sqnr']:.1f} dB, below {floor:g} dB "
                         f"({htp['own_drop_db']:.1f} dB lost at this op).")
            near = [f for f in result["lint"] if f["node"] and _near(f, htp, rows, result)]
            if near:
                lines.append("fp16 range problem: " + " ".join(f["message"] for f in near[:3]))
            else:
                lines.append("No value beyond fp16's range at or just before this op (fp16 lint on these samples): "
                             "an HTP fp16 divergence to report upstream (onnxruntime-qnn / Qualcomm QNN) with "
                             f"{params['onnx']} and node '{htp['node']}' ({htp['op_type']}); a quantized variant "
                             "may avoid it.")
        else:
            lines.append(_no_drop(htp, floor, "the fp16 binary against the float model"))
            lines += [f"fp16 lint: {f['message']}" for f in result["lint"][:3]]
        return lines

    if quant.get("tensor"):
        row = rows[quant["tensor"]]
        lines.append(f"Quantization drops first at tensor '{quant['tensor']}' (node '{quant['node']}', "
                     f"{quant['op_type']}, {row['bits']} bit): CPU QDQ vs float {quant['sqnr']:.1f} dB, below "
                     f"{floor:g} dB, {quant['own_drop_db']:.1f} dB lost at this op.")
        lines += _quantization_fix(quant, rows, params)
    else:
        lines.append(_no_drop(quant, floor, "the CPU QDQ model against the float model"))
        widespread = quant.get("below_floor", 0) > WIDESPREAD * max(1, quant.get("measured", 0))
        if widespread and params["variant"]["activation_bits"] == 8:
            lines.append(f"{quant['below_floor']} of {quant['measured']} tensors are below the floor: a few 16-bit "
                         "tensors will not fix that; try the variant with 16-bit activations (activations = "
                         f"\"uint16\"), then `doit tune:{params['model']}/<that variant>` to bring tensors back to "
                         "8 bit.")
        elif quant.get("culprits"):  # no single op, but tensors below the floor that add to it themselves
            worst = sorted(quant["culprits"], key=lambda t: -rows[t]["own_drop_db"]["cpu_vs_float"])[:MAX_LISTED]
            eight = [t for t in quant["culprits"] if t in worst and rows[t]["bits"] == 8]
            if eight:
                lines.append(f"The {len(eight)} 8-bit tensor(s) below the floor that lose >= {OWN_DROP_DB:g} dB "
                             "themselves are the candidates for 16 bit:\n" + overrides_line(params, eight))
                lines.append(_measure_it(params))
    if htp.get("tensor"):
        there = rows[htp["tensor"]]
        lines.append(f"The binary departs from the CPU QDQ model first at tensor '{htp['tensor']}' (node "
                     f"'{htp['node']}', {htp['op_type']}): binary vs CPU QDQ {htp['sqnr']:.1f} dB, and the binary is "
                     f"{there['binary_vs_float']['sqnr']:.1f} dB from float where the CPU QDQ model is "
                     f"{there['cpu_vs_float']['sqnr']:.1f} dB.")
        if quant.get("tensor") and _index(result, quant["tensor"]) < _index(result, htp["tensor"]):
            lines.append("That is after the quantization drop: fix that first, then diagnose again.")
        else:
            lines.append(f"An HTP-only divergence: report it upstream (onnxruntime-qnn / Qualcomm QNN) with "
                         f"{params['qdq']}, node '{htp['node']}' ({htp['op_type']}), the chip and this report.")
            eight = [t for t in htp["culprits"] if rows[t]["bits"] == 8][:MAX_LISTED]
            if eight:
                lines.append("A workaround to try (not measured here): the same tensors at 16 bit, which HTP "
                             "computes with other kernels:\n" + overrides_line(params, eight))
                lines.append(_measure_it(params))
    else:
        lines.append(f"No HTP-only divergence: nowhere below {floor:g} dB is the binary more than "
                     f"{HTP_WORSE_DB:g} dB farther from the float model than the CPU QDQ model is.")
    return lines


def _quantization_fix(drop: dict, rows: dict, params: dict) -> list[str]:
    row = rows[drop["tensor"]]
    pinned = params["variant"].get("overrides", {})
    lines = []
    if row["bits"] == 8 and params["variant"]["activation_bits"] == 16:
        why = (f" (the variant's overrides set it to {pinned[drop['tensor']]})" if drop["tensor"] in pinned else
               " (an override or node_override of the variant, or a type the quantizer chose for this op)")
        lines.append(f"It is 8 bit in a 16-bit variant{why}: keep it at 16 bit.")
    r = row.get("range", {})
    if r.get("clipped", 0) > 0.001:
        lines.append(f"Range: {100 * r['clipped']:.1f} % of its values on these samples fall outside the calibrated "
                     f"range [{r['quantized'][0]:.4g}, {r['quantized'][1]:.4g}] (they reach [{r['float'][0]:.4g}, "
                     f"{r['float'][1]:.4g}]): the calibration data does not cover the evaluation inputs; calibrate on "
                     "data like them (calibration_inputs), or more samples.")
    elif r.get("rms_steps") is not None and r["rms_steps"] < 4:
        lines.append(f"Range: the calibrated range [{r['quantized'][0]:.4g}, {r['quantized'][1]:.4g}] is so wide "
                     f"for its values (RMS {r['rms_steps']:.1f} quantization steps) that an outlier or a constant "
                     "(a -1e9 mask, a log(0)) must set it: fix that in the export (finite masks, an epsilon floor, "
                     "a clamp)" + ("; 16 bit cannot." if row["bits"] == 16 else "; 16 bit only helps so far."))
    small = [t for t in drop["sources"] if rows[t].get("range", {}).get("below_step", 0) > 0.01]
    if row["op_type"] in AMPLIFY_SMALL and small:
        r = rows[small[0]]["range"]
        lines.append(f"{row['op_type']} magnifies the error of small inputs, and its input '{small[0]}' is quantized "
                     f"with a step of {r['step']:.3g} (range [{r['quantized'][0]:.4g}, {r['quantized'][1]:.4g}]): "
                     f"{100 * r['below_step']:.1f} % of its values on these samples are below one step and lose all "
                     f"precision (an epsilon floor far below the step, e.g. max(x, 1e-12), does not help). Fix the "
                     f"export: a floor near the step (e.g. max(x, {r['step']:.2g})), or the op on a smaller range.")
    inputs_db = drop["sqnr"] + drop["own_drop_db"]  # the worst tensor it is computed from
    floor = FLOOR_DB[params["variant"]["activation_bits"]]
    if inputs_db < floor:
        # Measured on PP-OCRv4's detector at w8a8: its first drop (a depthwise Conv, 8.6 dB) stayed there with that
        # tensor and its input at 16 bit; only the 16 tensors before it at 16 bit brought it to 29 dB.
        lines.append(f"But the error builds up before it: the tensors it is computed from are already at "
                     f"{inputs_db:.1f} dB, and {drop['below_floor']} of {drop['measured']} tensors are below the floor"
                     + (" (a depthwise or grouped Conv shows the error of its input's weaker channels, which a "
                        "per-tensor SQNR hides)" if row["op_type"] in ("Conv", "ConvTranspose") else "")
                     + ". A few 16-bit tensors will not fix that: "
                     + ("try the variant with 16-bit activations (activations = \"uint16\"), then `doit tune:"
                        f"{params['model']}/<that variant>` to bring tensors back to 8 bit."
                        if params["variant"]["activation_bits"] == 8 else
                        "look at the range columns of the first tensors below the floor (a range set by outliers or "
                        "constants), and at the weights (weights = \"uint16\" for this variant)."))
        return lines
    eight = [t for t in drop["culprits"] if rows[t]["bits"] == 8][:MAX_LISTED]
    if eight:
        lines.append(f"Keep {'this tensor' if len(eight) == 1 else f'these {len(eight)} tensors'} at 16 bit (the "
                     f"first drop and every later 8-bit tensor below the floor that loses >= {OWN_DROP_DB:g} dB "
                     f"itself), in {params['model_toml']}:\n" + overrides_line(params, eight))
        lines.append(_measure_it(params))
    return lines


def _measure_it(params: dict) -> str:
    return (f"Then `doit check:{params['model']}/{params['graph_name']}/{params['variant_name']}@"
            f"{params['chip']['name']}` measures it, and `doit tune:{params['model']}/{params['variant_name']}` "
            "finds the fewest 16-bit tensors that meet the gate.")


def _no_drop(drop: dict, floor: float, what: str) -> str:
    low = drop.get("lowest")
    if not low:
        return f"{what}: nothing measured."
    if not drop.get("below_floor"):
        return (f"No drop of {what}: every tensor stays at or above {floor:g} dB (lowest {low['sqnr']:.1f} dB at "
                f"'{low['tensor']}', {low['op_type']}).")
    return (f"No single op where {what} drops (no tensor below {floor:g} dB loses >= {DROP_DB:g} dB itself): the "
            f"error builds up over {drop['below_floor']} tensor(s) below {floor:g} dB, lowest {low['sqnr']:.1f} dB at "
            f"'{low['tensor']}' ({low['op_type']}).")


def _index(result: dict, tensor: str) -> int:
    return next(i for i, r in enumerate(result["rows"]) if r["tensor"] == tensor)


def _near(finding: dict, drop: dict, rows: dict, result: dict) -> bool:
    """A lint finding at the drop's node, or at one of the few tensors before it."""
    names = [r["tensor"] for r in result["rows"]]
    at = names.index(drop["tensor"])
    window = {rows[n]["node"] for n in names[max(0, at - 3):at + 1]} | set(names[max(0, at - 3):at + 1])
    return finding["node"] in window or finding["tensor"] in window


# --- output -----------------------------------------------------------------------------------------------------

def _clean(value):
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def markdown(result: dict, params: dict) -> str:
    curves = ["binary_vs_cpu"] + ([] if result["fp16"] else ["cpu_vs_float"])
    shown = curves + ([] if result["fp16"] else ["binary_vs_float"])
    label = {"binary_vs_cpu": "binary vs CPU float" if result["fp16"] else "binary vs CPU QDQ",
             "cpu_vs_float": "CPU QDQ vs float", "binary_vs_float": "binary vs float"}
    e = result["exposure"]
    lines = [f"# Diagnose: {result['model']}/{result['graph']} / {result['variant']} on {result['chip']} "
             "(HTP emulator)", "",
             f"{len(result['samples'])} evaluation samples (numbers {', '.join(map(str, result['samples']))}); "
             f"{result['exposed']} of {result['tensors_total']} activation tensors exposed"
             + (f" (every {result['every']}th)" if result["every"] > 1 else "")
             + f"; SQNR floor {result['floor_db']:g} dB. Compile {result['seconds']['compile']:.1f} s, emulator "
             f"{result['seconds']['emulator']:.1f} s, total {result['seconds']['total']:.1f} s.", "",
             "Diagnose does not judge the gate (`doit check` does, on the whole evaluation set): on a binary that "
             "passes it, what follows is where the binary is weakest, not a fault to fix.", "",
             "## Likely fix", ""]
    lines += [f"- {line}" if "\n" not in line else "- " + line.split("\n", 1)[0] + "\n\n```toml\n"
              + line.split("\n", 1)[1] + "\n```" for line in result["diagnosis"]]
    lines += ["", "## Where each curve drops", ""]
    for c in curves:
        d = result["drops"].get(c) or {}
        low = d.get("lowest") or {}
        if d.get("tensor"):
            lines.append(f"- {label[c]}: first drop at `{d['tensor']}` (node `{d['node']}`, {d['op_type']}): "
                         f"{d['sqnr']:.2f} dB, {d['own_drop_db']:.1f} dB lost there; lowest "
                         f"{low.get('sqnr', 0):.2f} dB "
                         f"at `{low.get('tensor')}`.")
        elif low:
            lines.append(f"- {label[c]}: no first drop; {d.get('below_floor', 0)} tensor(s) below the floor, lowest "
                         f"{low['sqnr']:.2f} dB at `{low['tensor']}`.")
    lines.append(f"\n(A first drop: the first tensor below the floor, {result['floor_db']:g} dB, that loses at least "
                 f"{DROP_DB:g} dB itself, from the worst tensor it is computed from"
                 + ("" if result["fp16"] else f"; for the binary, only where it is also {HTP_WORSE_DB:g} dB farther "
                    "from float than the CPU QDQ model") + ".)")
    lines += ["", "## Did exposing the tensors change the binary?", ""]
    if e["identical"]:
        lines.append(f"No: with the tensors exposed, the final outputs on the emulator are bit-identical to the plain "
                     f"binary's ({params['ctx_model']}) on these samples.")
    else:
        lines.append(f"Slightly: the final outputs differ from the plain binary's by at most {e['max_abs']:.4g} "
                     "(per output: " + ", ".join(f"{n} {o['sqnr']:.1f} dB" for n, o in e["outputs"].items())
                     + " SQNR against the plain binary). Compare with the drops above: a drop much larger than "
                     "this is the binary's, not the exposure's.")
    lines += ["", "Final outputs of the plain binary against the float model on these samples: "
              + ", ".join(f"{n} {m['sqnr']:.1f} dB (cosine {m['cosine']:.5f})" for n, m in result["final"].items())
              + ".", ""]
    if result["lint"]:
        lines += ["## fp16 lint", ""] + [f"- {f['message']}" for f in result["lint"]] + [""]
    lines += [f"![diagnose]({result['graph']}.diagnose.png)", "", "## Tensors in graph order", "",
              "| # | tensor | node | op | bits | " + " | ".join(f"{label[c]} SQNR (dB)" for c in shown)
              + " | " + " | ".join(f"{label[c]} cosine" for c in shown) + " | own drop (dB) |",
              "|---" * (6 + 2 * len(shown)) + "|"]
    for i, r in enumerate(result["rows"]):
        own = r.get("own_drop_db", {})
        marks = [c for c in curves if (result["drops"].get(c) or {}).get("tensor") == r["tensor"]]
        lines.append(f"| {i} | `{r['tensor']}`{' **<- first drop**' if marks else ''} | `{r['node']}` | "
                     f"{r['op_type']} | {r['bits']} | "
                     + " | ".join(f"{r[c]['sqnr']:.2f}" for c in shown) + " | "
                     + " | ".join(f"{r[c]['cosine']:.5f}" for c in shown) + " | "
                     + " / ".join(f"{own.get(c, 0):.1f}" for c in curves) + " |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    curves = ["binary_vs_cpu"] + ([] if result["fp16"] else ["cpu_vs_float"])
    label = {"binary_vs_cpu": "binary vs CPU float model" if result["fp16"] else "binary vs CPU QDQ model",
             "cpu_vs_float": "CPU QDQ model vs float model", "binary_vs_float": "binary vs float model"}
    fig, ax = plt.subplots(figsize=(min(24.0, max(7.0, 0.12 * len(rows) + 4)), 4.5))
    x = list(range(len(rows)))
    for c in curves + ([] if result["fp16"] else ["binary_vs_float"]):
        ax.plot(x, [r[c]["sqnr"] for r in rows], marker="." if len(rows) < 80 else None, label=label[c],
                **({"linewidth": 0.8, "linestyle": ":"} if c == "binary_vs_float" else {}))
        d = result["drops"].get(c) or {}
        if d.get("tensor"):
            i = next(i for i, r in enumerate(rows) if r["tensor"] == d["tensor"])
            ax.annotate(f"{d['tensor'][-30:]} ({d['op_type']})", (i, d["sqnr"]), textcoords="offset points",
                        xytext=(5, -14), fontsize="x-small", arrowprops={"arrowstyle": "-"})
            ax.plot([i], [d["sqnr"]], "v", color="red")
    ax.axhline(result["floor_db"], color="grey", linestyle="--", linewidth=0.8,
               label=f"floor {result['floor_db']:g} dB")
    ax.set_xlabel("activation tensor, graph order")
    ax.set_ylabel("SQNR (dB)")
    ax.set_title(f"{result['model']}/{result['graph']} / {result['variant']} on {result['chip']}: tensor by tensor")
    ax.legend(fontsize="small")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)

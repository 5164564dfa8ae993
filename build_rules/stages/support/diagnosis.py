"""The words, the table and the plot of `doit diagnose` (stages/diagnose.py measures; not a stage itself): the
likely fix from the drops, <graph>.diagnose.md and <graph>.diagnose.png."""
from __future__ import annotations

import math
from pathlib import Path


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
FOUR_BIT_WEIGHTS = ("int4", "uint4")  # a layer reading these can lose more to its weight than a 16-bit output does
HTP_WORSE_DB = 6.0  # the binary this much farther from float than the CPU QDQ model: an HTP-only loss

SUBSET_MISS_DB = 3.0  # an output this much worse in check's measurement than on the diagnosed samples


# --- the likely fix ----------------------------------------------------------------------------------------------

def overrides_line(params: dict, tensors: list[str]) -> str:
    """The model.toml lines that keep `tensors` at 16 bit in this graph, merged with the graph's overrides."""
    from .concat_slices import overrides_toml
    return overrides_toml(params["variant_name"], params["graph_name"],
                          params["variant"].get("graph_overrides", {}).get("overrides", {}), tensors)


def weight_overrides_line(params: dict, nodes: list[str], wtype: str = "int8") -> str:
    """The model.toml lines that keep the weights of `nodes` at `wtype` in this graph, merged with the graph's
    weight_overrides."""
    own = dict(params["variant"].get("graph_overrides", {}).get("weight_overrides", {}))
    own.update({n: wtype for n in nodes})
    body = ", ".join(f'"{n}" = "{q}"' for n, q in own.items())
    return f"[variants.{params['variant_name']}.graphs.{params['graph_name']}]\nweight_overrides = {{ {body} }}"


def diagnose(result: dict, params: dict) -> list[str]:
    """The likely fix in words, from the drops; first, whether the diagnosed samples show the loss check measured."""
    unstable = []
    if result.get("instability"):  # first: every other number is one run of a binary that gives others
        from .instability import words
        unstable = words(params, result["instability"])
    return unstable + _subset_missed(result, params) + _from_drops(result, params)


def _subset_missed(result: dict, params: dict) -> list[str]:
    """A line when an output is >= SUBSET_MISS_DB worse in check's measurement than on these samples: the drops below
    were looked for where the binary does well (a new user's GRU cell: cosine 0.99999 on 4 samples, 0.9956 over 12).
    Check's measurement is of the whole evaluation set, or of its first k samples when the gate failed on them and
    check stopped early (check["partial"]); the line says which. No line when these samples are the whole set."""
    from ...tasks.diagnose import SAMPLES_ENV
    check = result.get("check") or {}
    total = check.get("of") or check.get("samples") or 0
    worse = [(name, check["outputs"][name], here) for name, here in result["final"].items()
             if name in check.get("outputs", {}) and check["outputs"][name]["sqnr"] < here["sqnr"] - SUBSET_MISS_DB]
    if not worse or len(result["samples"]) >= total:
        return []
    task = f"{params['model']}/{params['graph_name']}/{params['variant_name']}@{params['chip']['name']}"
    where = (f"on the first {check['samples']} of {total} samples (it stopped there: they already failed its gate)"
             if check.get("partial") else f"over all {total}")
    return [f"These {len(result['samples'])} samples miss the loss check measured {where}: "
            + "; ".join(f"{name} {c['sqnr']:.1f} dB (cosine {c['cosine']:.5f}) there, {h['sqnr']:.1f} dB (cosine "
                        f"{h['cosine']:.5f}) here" for name, c, h in worse)
            + f". Diagnose them all: `{SAMPLES_ENV}={total} doit diagnose:{task}`."]


def crushed_slices(result: dict) -> list[tuple[dict, list[dict]]]:
    """(row, its crushed parts) of each concatenated tensor (row["slices"], stages/diagnose.py split_concats) with a
    slice below the floor that loses >= DROP_DB against the input it is (when measured) and lies >= DROP_DB below
    the whole tensor: what one SQNR over the tensor hides (CPU QDQ vs float)."""
    found = []
    for row in result["rows"]:
        whole = row.get("cpu_vs_float", {}).get("sqnr")
        parts = []
        for p in (row.get("slices") or {}).get("parts", []):
            v = p["cpu_vs_float"]["sqnr"]
            before = (p.get("input_db") or {}).get("cpu_vs_float", CAP_DB)
            if whole is not None and v < result["floor_db"] and v <= before - DROP_DB and v <= whole - DROP_DB:
                parts.append(p)
        if parts:
            found.append((row, parts))
    return found


def _slice_fix(result: dict, params: dict) -> list[str]:
    """The likely fix of each crushed slice (crushed_slices()): which slice, its numbers, and the override lines (the
    concatenated tensor, the graph output it becomes, and each narrow input's source at 16 bit), or the export's
    fix when 16 bit cannot resolve it either."""
    from .concat_slices import EXPORT_FIX, MIN_STEPS
    lines = []
    for row, parts in crushed_slices(result):
        cut = row["slices"]
        lines.append(
            f"Tensor '{row['tensor']}' (node '{row['node']}', Concat, {row['bits']} bit, a step of {cut['step']:.4g}) "
            f"joins inputs of very different ranges, and one SQNR over it ({row['cpu_vs_float']['sqnr']:.1f} dB, CPU "
            "QDQ vs float) hides a crushed slice: " + "; ".join(
                f"'{p['input']}' ({p['start']}:{p['stop']} on axis {cut['axis']}; values [{p['range'][0]:.4g}, "
                f"{p['range'][1]:.4g}] on these samples, {p['steps']:.3g} steps) at {p['cpu_vs_float']['sqnr']:.1f} dB "
                f"(binary {p['binary_vs_float']['sqnr']:.1f} dB, cosine {p['binary_vs_float']['cosine']:.4f})"
                + (f", where that input itself is at {p['input_db']['cpu_vs_float']:.1f} dB" if p.get("input_db")
                   else "") for p in parts)
            + ". A task metric on that slice sees it (a detector's class scores), the whole tensor's cosine and SQNR "
              "do not.")
        at16 = min(p["steps"] for p in parts) * 65535 / 255
        if row["bits"] == 8 and at16 >= MIN_STEPS:
            tensors = [row["tensor"]] + ([cut["output"]] if cut.get("output") not in (None, row["tensor"]) else [])
            tensors += [p["source"] or p["input"] for p in parts]
            lines.append(f"Keep the concatenated tensor and the narrow input{'s' if len(parts) > 1 else ''} at 16 "
                         f"bit, in {params['model_toml']}:\n" + overrides_line(params, list(dict.fromkeys(tensors))))
            lines.append(_measure_it(params))
        else:
            lines.append(f"{'At' if row['bits'] == 16 else 'Even at'} 16 bit the narrow input(s) get "
                         f"{at16 if row['bits'] == 8 else min(p['steps'] for p in parts):.3g} steps: {EXPORT_FIX}.")
    return lines


def _from_drops(result: dict, params: dict) -> list[str]:
    rows = {r["tensor"]: r for r in result["rows"]}
    htp = result["drops"].get("binary_vs_cpu") or {}
    quant = result["drops"].get("cpu_vs_float") or {}
    floor = result["floor_db"]
    lines = [] if result["fp16"] else _slice_fix(result, params)
    sliced = bool(lines)
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
        lines += _quantization_fix(quant, rows, params, result, sliced)
    else:
        lines.append(_no_drop(quant, floor, "the CPU QDQ model against the float model"))
        widespread = quant.get("below_floor", 0) > WIDESPREAD * max(1, quant.get("measured", 0))
        if widespread and sliced:
            lines.append(f"{quant['below_floor']} of {quant['measured']} tensors are below the floor, but fix the "
                         "crushed slice above first and measure it: a 16-bit variant only if the gate still fails.")
        elif widespread and params["variant"]["activation_bits"] == 8:
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


def _quantization_fix(drop: dict, rows: dict, params: dict, result: dict, sliced: bool = False) -> list[str]:
    row = rows[drop["tensor"]]
    pinned = params["variant"].get("overrides", {})
    lines = _weight_fix(drop, rows, params)
    if lines and row["bits"] == 16:
        return lines  # a 16-bit output loses ~90 dB to its own rounding: the weight is the loss
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
                     + ("fix the crushed slice above first and measure it: a 16-bit variant only if the gate still "
                        "fails." if sliced else
                        "try the variant with 16-bit activations (activations = \"uint16\"), then `doit tune:"
                        f"{params['model']}/<that variant>` to bring tensors back to 8 bit."
                        if params["variant"]["activation_bits"] == 8 else
                        "look at the range columns of the first tensors below the floor (a range set by outliers or "
                        "constants), and at the weights" + _weights16(result) + "."))
        return lines
    eight = [t for t in drop["culprits"] if rows[t]["bits"] == 8][:MAX_LISTED]
    if eight:
        lines.append(f"Keep {'this tensor' if len(eight) == 1 else f'these {len(eight)} tensors'} at 16 bit (the "
                     f"first drop and every later 8-bit tensor below the floor that loses >= {OWN_DROP_DB:g} dB "
                     f"itself), in {params['model_toml']}:\n" + overrides_line(params, eight))
        lines.append(_measure_it(params))
    return lines


def _weights16(result: dict) -> str:
    """The 16-bit weight advice, only as far as the HTP builds it (diagnose compiled it: result["weights16"])."""
    checked = result.get("weights16")
    if checked is None:
        return ""
    if checked["compiles"]:
        return " (weights = \"uint16\" for this variant: it compiles for this chip)"
    return (f" (16-bit weights, weights = \"uint16\", do not compile for this graph on this chip: "
            f"{checked['error']}; 8-bit weights per channel are what the HTP takes)")


def _weight_fix(drop: dict, rows: dict, params: dict) -> list[str]:
    """When the op at the drop reads 4-bit weights: the loss is its weights', so the fix is the weight_overrides line
    keeping them at 8 bit (that node's, and those of the later 4-bit layers below the floor that lose >= OWN_DROP_DB
    themselves), or tune's per-layer weight bits. [] otherwise. (Measured on tests/models/densemap at w4a16: the first
    Conv's output, 16 bit, lost 64 dB to its int4 weight; an activation override cannot help there.)"""
    row = rows[drop["tensor"]]
    if row.get("weight") not in FOUR_BIT_WEIGHTS:
        return []
    later = [t for t in drop["culprits"] if rows[t].get("weight") in FOUR_BIT_WEIGHTS and t != drop["tensor"]]
    nodes = list(dict.fromkeys([row["node"]] + [rows[t]["node"] for t in later]))[:MAX_LISTED]
    others = (f" and the weights of the {len(nodes) - 1} later {row['weight']} layer(s) below the floor that lose >= "
              f"{OWN_DROP_DB:g} dB themselves" if len(nodes) > 1 else "")
    return [f"The loss is in the weights: node '{row['node']}' ({row['op_type']}) reads {row['weight']} weights, and "
            f"its output is {row['bits']} bit" + (", so an activation override cannot help" if row["bits"] == 16
                                                  else "")
            + f". Keep its weight{others} at 8 bit, in {params['model_toml']}:\n"
            + weight_overrides_line(params, nodes),
            f"Then `doit check:{params['model']}/{params['graph_name']}/{params['variant_name']}@"
            f"{params['chip']['name']}` measures it, and `doit tune:{params['model']}/{params['variant_name']}` finds "
            "the fewest weights at int8 that meet the gate (its per-layer weight bits, docs/tuning.md)."]


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

def clean(value):
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
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
             + f"; SQNR floor {result['floor_db']:g} dB. Emulator (compile and runs) "
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
    lines += _slices_markdown(result)
    lines += ["", "## Did exposing the tensors change the binary?", ""]
    if e["identical"] is None:
        lines.append("Cannot be told: the plain binary itself gives other outputs on another run (see above).")
    elif e["identical"]:
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
              "| # | tensor | node | op | bits (/ weight) | " + " | ".join(f"{label[c]} SQNR (dB)" for c in shown)
              + " | " + " | ".join(f"{label[c]} cosine" for c in shown) + " | own drop (dB) |",
              "|---" * (6 + 2 * len(shown)) + "|"]
    for i, r in enumerate(result["rows"]):
        own = r.get("own_drop_db", {})
        marks = [c for c in curves if (result["drops"].get(c) or {}).get("tensor") == r["tensor"]]
        lines.append(f"| {i} | `{r['tensor']}`{' **<- first drop**' if marks else ''} | `{r['node']}` | "
                     f"{r['op_type']} | {r['bits']}{' / ' + r['weight'] if r.get('weight') else ''} | "
                     + " | ".join(f"{r[c]['sqnr']:.2f}" for c in shown) + " | "
                     + " | ".join(f"{r[c]['cosine']:.5f}" for c in shown) + " | "
                     + " / ".join(f"{own.get(c, 0):.1f}" for c in curves) + " |")
    return "\n".join(lines) + "\n"


def _slices_markdown(result: dict) -> list[str]:
    """A table per concatenated tensor whose inputs differ in range by WIDE or more, or with a crushed slice."""
    from .concat_slices import WIDE
    crushed = {row["tensor"]: {p["input"] for p in parts} for row, parts in crushed_slices(result)}
    lines = []
    for row in result["rows"]:
        parts = (row.get("slices") or {}).get("parts", [])
        widths = [p["range"][1] - p["range"][0] for p in parts if p["range"][1] > p["range"][0]]
        if row["tensor"] not in crushed and (len(widths) < 2 or max(widths) < WIDE * min(widths)):
            continue
        cut = row["slices"]
        if not lines:
            lines = ["", "## Concatenated tensors, slice by slice", "",
                     "One SQNR over a tensor that joins inputs of very different ranges is the wide input's: each "
                     "input's slice against float, with its values' range on these samples in steps of the tensor's "
                     "scale (fewer than 16: crushed)."]
        lines += ["", f"`{row['tensor']}` (node `{row['node']}`, {cut['type']}, a step of {cut['step']:.4g}, axis "
                      f"{cut['axis']}; whole tensor: CPU QDQ vs float {row['cpu_vs_float']['sqnr']:.2f} dB, binary vs "
                      f"float {row['binary_vs_float']['sqnr']:.2f} dB, cosine {row['binary_vs_float']['cosine']:.5f}):",
                  "", "| slice | input | range on these samples | steps | CPU QDQ vs float SQNR (dB) | binary vs float "
                      "SQNR (dB) | binary vs float cosine | binary max abs | the input itself (dB) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for p in parts:
            mark = " **crushed**" if p["input"] in crushed.get(row["tensor"], ()) else ""
            own = p.get("input_db")
            lines.append(f"| {p['start']}:{p['stop']} | `{p['input']}`{mark} | [{p['range'][0]:.4g}, "
                         f"{p['range'][1]:.4g}] | {p['steps']:.3g} | {p['cpu_vs_float']['sqnr']:.2f} | "
                         f"{p['binary_vs_float']['sqnr']:.2f} | {p['binary_vs_float']['cosine']:.5f} | "
                         f"{p['binary_vs_float']['max_abs']:.4g} | "
                         + (f"{own['cpu_vs_float']:.2f}" if own else "not measured") + " |")
    return lines


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

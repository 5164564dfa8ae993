"""Stage 9 (ort-qnn), report: variants x chips of one model -> out/<model>/report.md, report.png, report.json.

The figure shows each gated metric per variant and chip against its gate's threshold, and the phones' latency
beside the CPU baseline where `doit profile` measured it (figure(); 1200 x 700 pixels for up to three panels).
Each cell (graph, variant, chip) shows the context binary's size and compile time (<graph>.compile.json) and its
metrics against the float model measured on the HTP emulator: cosine, SQNR, max abs and the score hook's task
metrics, next to the float model's own task metrics. A cell's measurement is read from its check report or
measurement memo when those were made from the same binary, evaluation set and hooks (digests compared);
a cell of another chip whose check proved its outputs equal to the reference chip's shows that chip's metrics, so
marked. A cell without any of these (its check has not run yet) is marked "not measured" with the command that
measures it: the report never runs the emulator, and reads no check it would have to wait for. A cell that fails
its gate is shown as failing, with its numbers (from the memo), instead of stopping the report.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..build_state import results
from ..measuring import gates
from ..toolchains.qnn_graph import combine, describe as describe_float_ops, mostly_float
from ..plumbing.files import atomic_write_json, atomic_write_text
from .check import COMPARED, measurement_key, remembered, summarize


MEASURED = ("samples", "outputs", "score", "float_score", "partial")


def _cell_metrics(cell: dict, hooks: str, data_dir) -> tuple[dict | None, str]:
    """(metrics, where they came from) for one cell: its check report or memo when made from this very binary, a
    check that proved this binary's outputs equal to another chip's ("equal to SM8750 on 3 samples"), else
    (None, "not measured"): the report shows what was measured and never runs the emulator itself."""
    from ..build_state.hashing import file_digest
    key = measurement_key(cell["ctx_model"], cell["evaluation"], hooks, data_dir)
    check = results.last(cell["check"]) or {}  # its report, or a failed one's from the memo
    if check.get("inputs") == key and "equal_to" not in check:  # (a failed check's report is in its memo)
        return {k: v for k, v in check.items() if k in MEASURED}, "memo" if check["passed"] is False else "check"
    proof = check.get("equal_to")
    if proof and check.get("inputs", {}).get("evaluation") == key["evaluation"] \
            and proof["binary"] == (key["binary"] if isinstance(key["binary"], list) else file_digest(
                str(cell["ctx_model"]).replace("_ctx.onnx", ".bin"))):
        return {k: v for k, v in check.items() if k in MEASURED}, \
            f"equal to {proof['chip']} on {proof['samples']} samples"
    metrics = remembered(cell["memo"], key)
    return (metrics, "memo") if metrics is not None else (None, "not measured")


def _compiled(path: str | list) -> dict:
    """A binary's compile report; a split graph's parts summed, with each part's size."""
    if not isinstance(path, list):
        return json.loads(Path(path).read_text())
    reports = [json.loads(Path(p).read_text()) for p in path]
    return {"bytes": sum(r["bytes"] for r in reports), "seconds": sum(r["seconds"] for r in reports),
            "part_bytes": [r["bytes"] for r in reports], "float_ops": combine([r.get("float_ops") for r in reports])}


def weight_counts(qdq: str | None, memo: dict) -> dict[str, int] | None:
    """How many of a QDQ model's weights are of each type ({"int4": 7, "int8": 1}): what a variant really is when
    some weights are not its `weights` type (overrides, weights the HTP takes at no int4). None for fp16."""
    if not qdq or not Path(qdq).is_file():
        return None
    if qdq not in memo:
        import onnx

        from ..quantization.block_quant import weight_types
        counts: dict[str, int] = {}
        for wtype in weight_types(onnx.load(qdq, load_external_data=False)).values():
            counts[wtype] = counts.get(wtype, 0) + 1
        memo[qdq] = dict(sorted(counts.items()))
    return memo[qdq]


def not_built(cell: dict) -> str | None:
    """Why a cell has no binary (None: it has one): the task that makes it failed, with the error line of its log,
    or it has not run (the variant's quantize failed). The compiles are the report's setup tasks: under --continue
    one that fails leaves its cell without a binary and the report goes on (tasks/tuning.py)."""
    files = cell["compile"] if isinstance(cell["compile"], list) else [cell["compile"]]
    missing = [m for f, m in zip(files, cell.get("made_by") or [{}] * len(files)) if not Path(f).is_file()]
    if cell.get("qdq") and not Path(cell["qdq"]).is_file():  # (a failed task's outputs are removed: runner.py)
        return f"no QDQ model: the variant's quantize failed or has not run ({cell['qdq']} is missing)"
    if not missing:
        return None
    made_by = missing[0]
    error = _error_line(made_by.get("log"))
    if error is None:
        return f"{made_by.get('task', 'its compile')} has not run"
    return f"{made_by['task']} failed: {error} (log: {made_by['log']})"


def _error_line(log: str | None) -> str | None:
    """The stage's error, the last 'error: <task>: ...' line of its log, without the task's name."""
    try:
        lines = [line for line in Path(log).read_text(errors="replace").splitlines() if line.startswith("error: ")]
    except (OSError, TypeError):
        return None
    if not lines:
        return None
    message = lines[-1].removeprefix("error: ")
    return message.split(": ", 1)[1] if message.split(": ", 1)[0].count(":") == 1 else message


def run(params: dict) -> dict:
    rows, weights_memo = [], {}
    for cell in params["cells"]:
        broken = not_built(cell)
        if broken is not None:  # its compile (or quantize) failed: shown, marked, without numbers
            print(f"{cell['variant']}@{cell['chip']} {cell['graph']}: not built: {broken}", flush=True)
            rows.append({"variant": cell["variant"], "chip": cell["chip"], "graph": cell["graph"], "bytes": None,
                         "compile_seconds": None, "gates": cell["gates"], "measured_by": "not built",
                         "not_built": broken, "float_ops": None, "weight_types": None, "mostly_float": None,
                         "samples": 0, "summary": {}, "float_score": {}, "gated": [], "passed": None})
            continue
        compiled = _compiled(cell["compile"])
        metrics, source = _cell_metrics(cell, params["hooks"], params.get("data_dir"))
        print(f"{cell['variant']}@{cell['chip']} {cell['graph']}: {source}", flush=True)
        row = {"variant": cell["variant"], "chip": cell["chip"], "graph": cell["graph"], "bytes": compiled["bytes"],
               "compile_seconds": compiled["seconds"],
               **({"part_bytes": compiled["part_bytes"]} if "part_bytes" in compiled else {}),
               "gates": cell["gates"], "measured_by": source, "float_ops": compiled.get("float_ops"),
               "weight_types": weight_counts(cell.get("qdq"), weights_memo),
               "mostly_float": mostly_float(compiled.get("float_ops")) or None}
        command = f"doit check:{params['model']}/{cell['graph']}/{cell['variant']}@{cell['chip']}"
        if metrics is None:  # its check has not run: marked, with the command that measures it
            row.update({"samples": 0, "summary": {}, "float_score": {}, "gated": [], "passed": None,
                        "measure_with": command})
        else:
            summary = summarize(metrics)
            row.update({"samples": metrics["samples"], "summary": summary, "float_score": metrics.get("float_score", {}),
                        "gated": gates.results(cell["gates"], summary, metrics.get("float_score", {}),
                                               metrics.get("partial")),
                        "passed": gates.passes_all(cell["gates"], summary, metrics.get("float_score", {}))})
            if "partial" in metrics:
                _judge_partial(row, metrics, cell["gates"], command)
        rows.append(row)
    report = {"model": params["model"], "toolchain": params["toolchain"], "variants": params["variants"],
              "cells": rows, "evaluate": evaluations(params.get("evaluations", {})), "quantizers": quantizers(params),
              "float_evaluation": (results.last(params["float_evaluation"]) or {}).get("metrics")
              if params.get("float_evaluation") else None}
    from ..device import results as device_results  # issue 29: the phones' device checks beside the emulator
    report["devices"] = device_results.report_rows(params["cells"], rows)
    report["device_timings"] = device_results.timing_rows(params["cells"])
    atomic_write_json(params["outputs"]["json"], report)
    atomic_write_text(params["outputs"]["markdown"], markdown(report))
    plot(report, params["outputs"]["png"])
    return {"cells": len(rows), "not_measured": sum(r["passed"] is None and r["measured_by"] == "not measured"
                                                     for r in rows),
            "not_built": sum(r["measured_by"] == "not built" for r in rows)}


def evaluations(paths: dict) -> dict:
    """variant@chip -> the last model-level evaluation (results.last: its report, or a failed one's numbers from the
    memo, with "passed")."""
    found = {}
    for name, path in paths.items():
        result = results.last(path)
        if result is not None:
            found[name] = result
    return found


def quantizers(params: dict) -> dict[str, str]:
    """Per variant who quantized it and how: "fp16", "ort minmax", "aimet seq_mse (htp_quantsim_config_v73.json)"."""
    found = {}
    for name, settings in params["variants"].items():
        if settings.get("precision") == "fp16":
            found[name] = "fp16"
            continue
        if settings.get("quantizer") != "aimet":
            found[name] = f"ort {settings.get('calibration_method', '')}".strip()
            continue
        configs = set()
        for path in params.get("aimet", {}).get(name, {}).values():
            try:
                configs.add(json.loads(Path(path).read_text())["config"]["file"])
            except (OSError, ValueError, KeyError):
                pass
        techniques = " + ".join(settings.get("techniques") or []) or settings.get("calibration_method", "minmax")
        found[name] = f"aimet {techniques}" + (f" ({', '.join(sorted(configs))})" if configs else "")
    return found


def _judge_partial(row: dict, metrics: dict, gate_list, command: str) -> None:
    """A check stopped after k of N samples (an early verdict): its numbers are the k samples', marked so, and only
    the gates those samples decide are failed (the others are not judged); a gate edited since, which the k samples
    no longer decide, leaves the cell not measured (its check measures every sample again)."""
    early = gates.still_decided(metrics, gate_list)
    if early is None:
        row.update({"samples": 0, "summary": {}, "float_score": {}, "gated": [], "passed": None,
                    "measured_by": "not measured", "measure_with": command})
        return
    failed = {f["metric"] for f in early["failed"]}
    row["partial"] = {"samples": early["samples"], "of": early["of"], "failed": [f["failure"] for f in early["failed"]]}
    # the gates the k samples do not decide are not judged (a score hook's metric was not even measured: its entry
    # says why, gates.stopped_before)
    row["gated"] = [{**g, "passed": False} if g["metric"] in failed else {**g, "passed": None, "stopped": True}
                    for g in row["gated"]]
    row["passed"] = False


def _partial_mark(row: dict, short: bool = False) -> str:
    """' (1 of 4 samples)' after the numbers of a check stopped early (short: ' (1 of 4)'); '' otherwise."""
    partial = row.get("partial")
    return f" ({partial['samples']} of {partial['of']}{'' if short else ' samples'})" if partial else ""


def _unjudged(row: dict) -> str:
    """What a check stopped early left unmeasured: ' (det_f1 not measured: score() runs only on a check of every
    sample)'."""
    unmeasured = [g["metric"] for g in row["gated"] if g.get("stopped") and g["value"] is None]
    return (f" ({' and '.join(unmeasured)} not measured: score() runs only on a check of every sample)"
            if unmeasured else "")


def _fmt(value, digits=4) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        if value == float("inf"):
            return "inf"
        return f"{value:.{digits}g}"
    return str(value)


def _gate_text(row: dict) -> str:
    """Each gate with its verdict: 'pass (cosine >= 0.98); **FAIL** (f1 within 0.1 of float)'; a gate a check
    stopped early did not decide: 'not judged, stopped early (det_f1 >= 0.9)'."""
    verdicts = {True: "pass", False: "**FAIL**", None: "–"}
    return "; ".join(f"{'not judged, stopped early' if r.get('stopped') else verdicts[r['passed']]} ({r['gate']})"
                     for r in row["gated"]) or "–"


def _gated_metrics(rows: list[dict], graph: str) -> list[str]:
    """The metrics a graph's summary column shows: its gates' (every gate of the first cell that has any), or cosine."""
    gated = next((r["gates"] for r in rows if r["graph"] == graph and r["gates"]), [])
    return list(dict.fromkeys(g["metric"] for g in gated)) or ["cosine"]


def _float_text(row: dict) -> str:
    """What a quantized binary runs in float: 'none', '3 LSTM ran in float (98.9 % of the weights)'; fp16: '–'."""
    info = row.get("float_ops")
    if info is None:
        return "–"
    return describe_float_ops(info) or ("unknown" if info.get("error") else "none")


def _equal_mark(row: dict) -> str:
    """' (= SM8750)' on a cell whose metrics are another chip's binary's, its outputs proven equal."""
    by = row["measured_by"]
    return f" (= {by.split()[2]})" if by.startswith("equal to ") else ""


def _beside_float(metrics: dict, baseline: dict) -> str:
    """'wer 0.0526 (float 0.0526, +0)': rounded, with the float model's value and the difference."""
    parts = []
    for name, value in metrics.items():
        if not isinstance(value, (int, float)):
            continue
        text = f"{name} {_fmt(float(value))}"
        ref = baseline.get(name)
        if isinstance(ref, (int, float)):
            text += f" (float {_fmt(float(ref))}, {float(value) - float(ref):+.4g})"
        parts.append(text)
    return ", ".join(parts) or "–"


def _other_weights(rows: list[dict], weights: str | None) -> str:
    """' (3 int8 of 8 weights)' when some of the variant's weights are of another type than its `weights`."""
    counts: dict[str, int] = {}
    for row in rows:
        for wtype, n in (row.get("weight_types") or {}).items():
            counts[wtype] = counts.get(wtype, 0) + n
    total = sum(counts.values())
    others = [f"{n} {wtype}" for wtype, n in counts.items() if wtype != weights]
    return f" ({', '.join(others)} of {total} weights)" if others else ""


def _task_metrics(row: dict) -> str:
    """The score hook's metrics, each with its share of the float model's; a check stopped early measured none."""
    if row.get("partial"):
        return f"not measured (stopped after {row['partial']['samples']} of {row['partial']['of']} samples)"
    parts = []
    for name, value in row["summary"].items():
        if name in COMPARED:  # the comparison metrics (frame_cosine too): not the hook's
            continue
        ref = row["float_score"].get(name)
        kept = f" ({100 * value / ref:.1f} % of float)" if ref else ""
        parts.append(f"{name} {value:.4g}{kept}")
    return ", ".join(parts) or "–"


def markdown(report: dict) -> str:
    rows = report["cells"]
    graphs = sorted({r["graph"] for r in rows})
    lines = [f"# {report['model']}: variants x chips", "",
             f"Measured on the HTP emulator ({report['toolchain'].get('name')} {report['toolchain'].get('build_id', '')}) "
             f"against the float model; sizes are the context binaries. Rebuild with `doit report:{report['model']}`.", ""]
    # Summary: one row per variant and chip, one column per graph (its gated metrics, or cosine).
    header = ["variant", "quantizer", "weights/activations", "chip", "size (MB)", "compile (s)"]
    for g in graphs:
        header.append(f"{g} {' / '.join(_gated_metrics(rows, g))}")
    header.append("gates")
    lines += ["## Summary", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    pairs = []
    for r in rows:
        if (r["variant"], r["chip"]) not in pairs:
            pairs.append((r["variant"], r["chip"]))
    for variant, chip in pairs:
        cells = {r["graph"]: r for r in rows if r["variant"] == variant and r["chip"] == chip}
        broken = [g for g, r in cells.items() if r["measured_by"] == "not built"]
        size = "–" if broken else f"{sum(r['bytes'] for r in cells.values()) / 1e6:.3f}"
        seconds = "–" if broken else f"{sum(r['compile_seconds'] for r in cells.values()):.2f}"
        values = []
        for g in graphs:
            r = cells.get(g)
            values.append(r["measured_by"] if r and r["measured_by"] in ("not measured", "not built") else
                          " / ".join(_fmt(r["summary"].get(m)) for m in _gated_metrics(rows, g)) + _partial_mark(r)
                          + _equal_mark(r) if r else "–")
        failed = [g for g, r in cells.items() if r["passed"] is False]
        unmeasured = [g for g, r in cells.items() if r["measured_by"] == "not measured"]
        verdict = "; ".join(([f"**NOT BUILT**: {', '.join(broken)}"] if broken else [])
                            + ([f"FAIL: {', '.join(failed)}"] if failed else [])
                            + ([f"not measured: {', '.join(unmeasured)}"] if unmeasured else [])) or "pass"
        settings = report["variants"].get(variant, {})
        bits = "fp16" if settings.get("precision") == "fp16" else f"{settings.get('weights')}/{settings.get('activations')}"
        bits += _other_weights(list(cells.values()), settings.get("weights"))
        lines.append(f"| {variant} | {report.get('quantizers', {}).get(variant, '–')} | {bits} | {chip} | {size} | "
                     f"{seconds} | " + " | ".join(values) + f" | {verdict} |")
    lines += ["", "## Per graph", "",
              "| variant | chip | graph | size (KB) | compile (s) | cosine | SQNR (dB) | max abs | task metrics | gate "
              "| measured | float ops |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s = r["summary"]
        if r["measured_by"] == "not built":
            lines.append(f"| {r['variant']} | {r['chip']} | {r['graph']} | – | – | – | – | – | – | – | not built | – |")
            continue
        size = f"{r['bytes'] / 1e3:.1f}" + (" (" + " + ".join(f"{b / 1e3:.1f}" for b in r["part_bytes"]) + ")"
                                              if r.get("part_bytes") else "")  # a split graph: each part's size
        of = _partial_mark(r, short=True)  # a check stopped early: each number is of its first k samples
        lines.append(f"| {r['variant']} | {r['chip']} | {r['graph']} | {size} | "
                     f"{r['compile_seconds']:.2f} | {_fmt(s.get('cosine'), 6)}{of} | {_fmt(s.get('sqnr'))}{of} | "
                     f"{_fmt(s.get('max_abs'))}{of} | {_task_metrics(r)} | {_gate_text(r)} | {r['measured_by']}{_partial_mark(r)} | "
                     f"{_float_text(r)} |")
    stopped = [r for r in rows if r.get("partial")]
    if stopped:  # an early verdict's numbers are those of the first k samples: said, never taken for all N
        lines += ["", "**Stopped early** (the gate failed whatever the other samples give; the numbers are those of the "
                      "samples measured): " + "; ".join(
                          f"{r['variant']}@{r['chip']} {r['graph']} after {r['partial']['samples']} of "
                          f"{r['partial']['of']} samples: {', '.join(r['partial']['failed'])}{_unjudged(r)}"
                          for r in stopped)]
    broken = [r for r in rows if r.get("not_built")]
    if broken:  # a variant that does not build (doit --continue): every other variant is shown, this one says why
        lines += ["", "**Not built** (no binary; the others are reported as usual): " + "; ".join(
            f"{r['variant']}@{r['chip']} {r['graph']}: {r['not_built']}" for r in broken)]
    unmeasured = [r["measure_with"] for r in rows if r.get("measure_with")]
    if unmeasured:  # the report runs no check and no emulator: measuring the rest stays one command away
        how = ", ".join(f"`{c}`" for c in unmeasured) if len(unmeasured) <= 3 else \
            f"`doit --continue 'check:{report['model']}/*'` (every check of the model)"
        lines += ["", f"{len(unmeasured)} of {len(rows)} binaries not measured yet (their checks have not run; the "
                      f"report shows what the checks measured and runs none itself): {how}, then "
                      f"`doit report:{report['model']}`."]
    warned = [r for r in rows if r.get("mostly_float")]
    if warned:  # a quantized variant that is mostly float is not what its name says
        lines += ["", "**Mostly float:** " + "; ".join(dict.fromkeys(f"{r['variant']} {r['graph']}: {r['mostly_float']}"
                                                                    for r in warned))]
    if report.get("evaluate"):
        baseline = report.get("float_evaluation") or {}
        lines += ["", "## Model-level evaluation", "", f"Each metric beside the float model's on the CPU"
                  f"{'' if baseline else ' (not measured yet: `doit evaluate:' + report['model'] + '/float`)'} "
                  "and the difference.", "", "| variant@chip | metrics | gate |", "|---|---|---|"]
        for name, value in report["evaluate"].items():
            gate = "–" if not value.get("gates") or value.get("passed") is None else \
                ("pass" if value["passed"] else f"**FAIL** ({value.get('error', '').split(': ', 1)[-1]})")
            metrics = _beside_float(value.get("metrics") or {}, baseline) + _partial_mark(value)
            lines.append(f"| {name} | {metrics} | {gate} |")
    from ..device import results as device_results  # issue 29: "On phones" table (empty without device checks)
    lines += device_results.markdown(report) + device_results.timing_markdown(report)
    lines += ["", "## Variants", ""]
    for name, settings in report["variants"].items():
        lines.append(f"- **{name}**: " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in settings.items()
                                                   if v not in ({}, None)))
    lines += ["", "![variants x chips](report.png)", ""]
    return "\n".join(lines)


FIGURE_INCHES = (12.0, 7.0)  # at FIGURE_DPI: 1200 x 700 pixels for one row of panels
FIGURE_DPI = 100
PANELS_PER_ROW = 3


def panels(report: dict) -> list[dict]:
    """What the figure shows, one panel per gated metric of each graph (and of the model's [evaluate] gate):
    {"title", "metric", "points": [{"variant", "chip", "value", "passed", "low", "high", "float", "partial"}]}; a
    graph without gates shows its cosine. Points of cells not measured yet have value None (and "not_built": True
    when the cell has no binary); partial: "k of N" when the value is of the first k samples (an early verdict),
    else None."""
    found: dict[tuple[str, str], dict] = {}
    rows = report["cells"]
    entries = [(r["graph"], r["variant"], r["chip"], r["summary"], r["gated"], r.get("partial"),
                r["measured_by"] == "not built") for r in rows]
    for name, value in (report.get("evaluate") or {}).items():
        variant, chip = name.split("@", 1)
        entries.append(("model", variant, chip, value.get("metrics") or {}, value.get("gated") or [],
                        value.get("partial"), False))
    for graph, variant, chip, measured, gated, partial, broken in entries:
        metrics = ([g["metric"] for g in gated] or (_gated_metrics(rows, graph) if graph != "model" else []))
        for metric in dict.fromkeys(metrics):
            panel = found.setdefault((graph, metric), {"title": f"{graph}: {metric}", "metric": metric, "points": []})
            gate = next((g for g in gated if g["metric"] == metric), {})
            value = measured.get(metric)
            panel["points"].append({"variant": variant, "chip": chip,
                                    "value": float(value) if isinstance(value, (int, float)) else None,
                                    "passed": gate.get("passed"), "low": gate.get("low"), "high": gate.get("high"),
                                    "float": gate.get("float"),
                                    "partial": f"{partial['samples']} of {partial['of']}" if partial else None,
                                    **({"not_built": True} if broken else {})})
    return list(found.values())


def latency_bars(report: dict) -> list[dict]:
    """The phones' median latency per variant, chip, phone and graph (doit profile), with the CPU baseline where it
    was measured: [{"label", "npu_ms", "cpu_ms"}]."""
    bars = []
    for r in report.get("device_timings") or []:
        if r["kind"] != "profile":
            continue
        for graph, t in (r.get("graphs") or {}).items():
            if t.get("median_ms") is None:
                continue
            cpu = t.get("cpu") or {}
            bars.append({"label": f"{r['variant']}@{r['chip']} {graph} ({r['device']})", "npu_ms": t["median_ms"],
                         "cpu_ms": cpu.get("median_ms") if cpu.get("measured") else None})
    return bars


def figure(report: dict):
    """The report's figure (a matplotlib Figure): per gated metric, each variant's value on each chip against its
    gate's threshold (red ring: the gate failed); and the latency on phones beside the CPU baseline when a profile
    was measured. 1200 x 700 pixels for up to three panels, taller by a row per three more."""
    import math

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    shown = panels(report)
    bars = latency_bars(report)
    count = max(1, len(shown) + bool(bars))
    rows = math.ceil(count / PANELS_PER_ROW)
    columns = min(count, PANELS_PER_ROW)
    width, height = FIGURE_INCHES
    fig = plt.figure(figsize=(width, height + 3.6 * (rows - 1)), dpi=FIGURE_DPI)
    grid = fig.add_gridspec(rows, columns)
    variants = list(dict.fromkeys(r["variant"] for r in report["cells"]))
    chips = list(dict.fromkeys(r["chip"] for r in report["cells"]))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    markers = "osD^v<>pP*Xh"
    spread = 0.75 / max(1, len(chips))  # chips side by side within a variant: equal values stay apart
    failed_any = unmeasured_any = broken_any = False
    for index, panel in enumerate(shown):
        ax = fig.add_subplot(grid[index // columns, index % columns])
        values = [p["value"] for p in panel["points"] if p["value"] is not None and math.isfinite(p["value"])]
        # (inf: identical outputs' SQNR, drawn at the axis's edge; nan: nothing to draw)
        limits = {p[k] for p in panel["points"] for k in ("low", "high") if p[k] is not None}
        floats = {p["float"] for p in panel["points"] if p["float"] is not None}  # its dotted line is in view too
        span = [*values, *limits, *floats] or [0.0, 1.0]
        low, high = min(span), max(span)
        pad = (high - low) * 0.12 or abs(high) * 0.05 or 0.05
        for point in panel["points"]:
            x = variants.index(point["variant"]) + (chips.index(point["chip"]) - (len(chips) - 1) / 2) * spread
            at = chips.index(point["chip"])
            color, marker = colors[at % len(colors)], markers[at % len(markers)]
            if point.get("not_built"):  # its compile failed (doit --continue): a black x at the bottom
                broken_any = True
                ax.scatter(x, low - pad * 0.6, marker="x", color="black", s=40, zorder=3)
                continue
            if point["value"] is None or math.isnan(point["value"]):
                unmeasured_any = True
                ax.scatter(x, low - pad * 0.6, marker="x", color="grey", s=40, zorder=3)
                continue
            failed = point["passed"] is False
            failed_any |= failed
            y = min(max(point["value"], low - pad), high + pad)  # inf (identical outputs) on the axis's edge
            ax.scatter(x, y, color=color, marker=marker, s=60, zorder=3,
                       edgecolors="red" if failed else "none", linewidths=2.2)
            stopped = f" ({point['partial']} samples)" if point.get("partial") else ""
            if len(chips) <= 2:  # the value beside its point (more chips: their values would overlap)
                ax.annotate(f"{point['value']:.4g}{stopped}", (x, y), xytext=(7, -3), textcoords="offset points", fontsize=9)
            elif stopped:  # a check stopped early: its value is of the first k samples, said beside it on any chart
                ax.annotate(stopped.strip(" ()"), (x, y), xytext=(7, -3), textcoords="offset points", fontsize=8)
        for bound in sorted(limits):  # the gate's threshold(s): a lower and an upper one for max_change
            ax.axhline(bound, color="black", linestyle="--", linewidth=1.2, zorder=2)
        for ref in floats:
            ax.axhline(ref, color="grey", linestyle=":", linewidth=1.2, zorder=1)
        ax.set_ylim(low - pad, high + pad)
        ax.set_xticks(range(len(variants)), variants, rotation=20 if len(variants) > 4 else 0)
        ax.set_xlim(-0.6, len(variants) - 0.4)
        ax.set_title(panel["title"], fontsize=12)
        ax.set_ylabel(panel["metric"] + (" (higher is better)" if any(p["low"] is not None for p in panel["points"])
                                         else " (lower is better)" if any(p["high"] is not None
                                                                          for p in panel["points"]) else ""))
        ax.set_xlabel("variant")
        ax.grid(True, axis="y", alpha=0.3)
    if bars:
        ax = fig.add_subplot(grid[len(shown) // columns, len(shown) % columns])
        ys = range(len(bars))
        ax.barh([y + 0.2 for y in ys], [b["npu_ms"] for b in bars], height=0.4, color=colors[0], label="NPU (HTP)")
        cpu = [(y, b["cpu_ms"]) for y, b in zip(ys, bars) if b["cpu_ms"] is not None]
        if cpu:
            ax.barh([y - 0.2 for y, _ in cpu], [ms for _, ms in cpu], height=0.4, color="grey", label="CPU baseline")
        ax.set_yticks(list(ys), [b["label"] for b in bars], fontsize=9)
        ax.invert_yaxis()
        ax.set_xlabel("median latency (ms)")
        ax.set_title("latency on phones (doit profile)", fontsize=12)
        ax.legend(loc="lower right", fontsize=9)
        ax.grid(True, axis="x", alpha=0.3)
    handles = [Line2D([], [], color=colors[i % len(colors)], marker=markers[i % len(markers)], linestyle="",
                      markersize=9, label=chip) for i, chip in enumerate(chips)]
    if any(p["low"] is not None or p["high"] is not None for panel in shown for p in panel["points"]):
        handles.append(Line2D([], [], color="black", linestyle="--", label="gate threshold"))
    if any(p["float"] is not None for panel in shown for p in panel["points"]):
        handles.append(Line2D([], [], color="grey", linestyle=":", label="float model"))
    if failed_any:
        handles.append(Line2D([], [], color="white", marker="o", markeredgecolor="red", markeredgewidth=2.2,
                              linestyle="", markersize=9, label="gate failed"))
    if unmeasured_any:
        handles.append(Line2D([], [], color="grey", marker="x", linestyle="", label="not measured yet"))
    if broken_any:
        handles.append(Line2D([], [], color="black", marker="x", linestyle="", label="not built"))
    per_row = min(len(handles), 6)
    fig.legend(handles=handles, loc="lower center", ncol=per_row, fontsize=11, frameon=False)
    fig.suptitle(f"{report['model']}: gated metrics per variant and chip (HTP emulator vs float model)", fontsize=14)
    legend_inches = 0.15 + 0.32 * math.ceil(len(handles) / per_row)  # the legend's rows under the panels
    tall = fig.get_figheight()
    fig.tight_layout(rect=(0, legend_inches / tall, 1, 1 - 0.45 / tall))
    return fig


def plot(report: dict, path: str) -> None:
    import matplotlib.pyplot as plt
    fig = figure(report)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=FIGURE_DPI, metadata={"Software": None})
    plt.close(fig)

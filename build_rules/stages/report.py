"""Stage 9 (ort-qnn), report: variants x chips of one model -> out/<model>/report.md, report.png, report.json.

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

from .. import gates, results
from ..toolchains.qnn_graph import combine, describe as describe_float_ops, mostly_float
from ..files import atomic_write_json, atomic_write_text
from .check import measurement_key, remembered, summarize


MEASURED = ("samples", "outputs", "score", "float_score")


def _cell_metrics(cell: dict, hooks: str, data_dir) -> tuple[dict | None, str]:
    """(metrics, where they came from) for one cell: its check report or memo when made from this very binary, a
    check that proved this binary's outputs equal to another chip's ("equal to SM8750 on 3 samples"), else
    (None, "not measured"): the report shows what was measured and never runs the emulator itself."""
    from ..hashing import file_digest
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


def run(params: dict) -> dict:
    rows = []
    for cell in params["cells"]:
        compiled = _compiled(cell["compile"])
        metrics, source = _cell_metrics(cell, params["hooks"], params.get("data_dir"))
        print(f"{cell['variant']}@{cell['chip']} {cell['graph']}: {source}", flush=True)
        row = {"variant": cell["variant"], "chip": cell["chip"], "graph": cell["graph"], "bytes": compiled["bytes"],
               "compile_seconds": compiled["seconds"],
               **({"part_bytes": compiled["part_bytes"]} if "part_bytes" in compiled else {}),
               "gates": cell["gates"], "measured_by": source, "float_ops": compiled.get("float_ops"),
               "mostly_float": mostly_float(compiled.get("float_ops")) or None}
        if metrics is None:  # its check has not run: marked, with the command that measures it
            row.update({"samples": 0, "summary": {}, "float_score": {}, "gated": [], "passed": None,
                        "measure_with": f"doit check:{params['model']}/{cell['graph']}/{cell['variant']}@{cell['chip']}"})
        else:
            summary = summarize(metrics)
            row.update({"samples": metrics["samples"], "summary": summary, "float_score": metrics.get("float_score", {}),
                        "gated": gates.results(cell["gates"], summary, metrics.get("float_score", {})),
                        "passed": gates.passes_all(cell["gates"], summary, metrics.get("float_score", {}))})
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
                                                     for r in rows)}


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


def _fmt(value, digits=4) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        if value == float("inf"):
            return "inf"
        return f"{value:.{digits}g}"
    return str(value)


def _gate_text(row: dict) -> str:
    """Each gate with its verdict: 'pass (cosine >= 0.98); **FAIL** (f1 within 0.1 of float)'."""
    verdicts = {True: "pass", False: "**FAIL**", None: "–"}
    return "; ".join(f"{verdicts[r['passed']]} ({r['gate']})" for r in row["gated"]) or "–"


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


def _task_metrics(row: dict) -> str:
    parts = []
    for name, value in row["summary"].items():
        if name in ("cosine", "sqnr", "max_abs"):
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
             "against the float model; sizes are the context binaries. Rebuild with `doit report`.", ""]
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
        size = sum(r["bytes"] for r in cells.values()) / 1e6
        seconds = sum(r["compile_seconds"] for r in cells.values())
        values = []
        for g in graphs:
            r = cells.get(g)
            values.append("not measured" if r and r["measured_by"] == "not measured" else
                          " / ".join(_fmt(r["summary"].get(m)) for m in _gated_metrics(rows, g)) + _equal_mark(r)
                          if r else "–")
        failed = [g for g, r in cells.items() if r["passed"] is False]
        unmeasured = [g for g, r in cells.items() if r["measured_by"] == "not measured"]
        verdict = "; ".join(([f"FAIL: {', '.join(failed)}"] if failed else [])
                            + ([f"not measured: {', '.join(unmeasured)}"] if unmeasured else [])) or "pass"
        settings = report["variants"].get(variant, {})
        bits = "fp16" if settings.get("precision") == "fp16" else f"{settings.get('weights')}/{settings.get('activations')}"
        lines.append(f"| {variant} | {report.get('quantizers', {}).get(variant, '–')} | {bits} | {chip} | {size:.3f} | "
                     f"{seconds:.2f} | " + " | ".join(values) + f" | {verdict} |")
    lines += ["", "## Per graph", "",
              "| variant | chip | graph | size (KB) | compile (s) | cosine | SQNR (dB) | max abs | task metrics | gate "
              "| measured | float ops |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s = r["summary"]
        size = f"{r['bytes'] / 1e3:.1f}" + (" (" + " + ".join(f"{b / 1e3:.1f}" for b in r["part_bytes"]) + ")"
                                              if r.get("part_bytes") else "")  # a split graph: each part's size
        lines.append(f"| {r['variant']} | {r['chip']} | {r['graph']} | {size} | "
                     f"{r['compile_seconds']:.2f} | {_fmt(s.get('cosine'), 6)} | {_fmt(s.get('sqnr'))} | "
                     f"{_fmt(s.get('max_abs'))} | {_task_metrics(r)} | {_gate_text(r)} | {r['measured_by']} | "
                     f"{_float_text(r)} |")
    unmeasured = [r["measure_with"] for r in rows if r.get("measure_with")]
    if unmeasured:  # the report shows what was measured; measuring the rest stays one command away
        how = ", ".join(f"`{c}`" for c in unmeasured) if len(unmeasured) <= 3 else "`doit check` (every missing check)"
        lines += ["", f"{len(unmeasured)} of {len(rows)} binaries not measured yet (their checks have not run): "
                      f"{how}, then `doit report`."]
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
            lines.append(f"| {name} | {_beside_float(value.get('metrics') or {}, baseline)} | {gate} |")
    from ..device import results as device_results  # issue 29: "On phones" table (empty without device checks)
    lines += device_results.markdown(report) + device_results.timing_markdown(report)
    lines += ["", "## Variants", ""]
    for name, settings in report["variants"].items():
        lines.append(f"- **{name}**: " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in settings.items()
                                                   if v not in ({}, None)))
    lines += ["", "![variants x chips](report.png)", ""]
    return "\n".join(lines)


def plot(report: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["cells"]
    graphs = sorted({r["graph"] for r in rows})
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    chips = list(dict.fromkeys(r["chip"] for r in rows))
    markers = "osD^v<>pP*Xh"
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, len(graphs), figsize=(4.2 * len(graphs), 3.8), squeeze=False)
    for ax, graph in zip(axes[0], graphs):
        for r in (r for r in rows if r["graph"] == graph):
            if "sqnr" not in r["summary"]:
                continue  # not measured yet
            sqnr = r["summary"]["sqnr"]
            y = min(sqnr, 80.0) if sqnr == sqnr else 0.0  # fp16 can be near-lossless: clip inf for the axis
            ax.scatter(r["bytes"] / 1e3, y, color=colors[variants.index(r["variant"]) % len(colors)],
                       marker=markers[chips.index(r["chip"]) % len(markers)],
                       edgecolors="red" if r["passed"] is False else "none", linewidths=1.5, s=40)
        ax.set_title(graph)
        ax.set_xlabel("context binary (KB)")
        ax.set_ylabel("SQNR vs float (dB, worst output)")
        ax.grid(True, alpha=0.3)
    handles = [plt.Line2D([], [], color=colors[i % len(colors)], marker="o", linestyle="", label=v)
               for i, v in enumerate(variants)]
    handles += [plt.Line2D([], [], color="grey", marker=markers[i % len(markers)], linestyle="", label=c)
                for i, c in enumerate(chips)]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 8), fontsize="small")
    fig.suptitle(f"{report['model']}: size vs accuracy on the HTP emulator (red edge: gate failed)")
    fig.tight_layout(rect=(0, 0.1, 1, 0.95))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)

"""Stage 9 (ort-qnn), report: variants x chips of one model -> out/<model>/report.md, report.png, report.json.

Each cell (graph, variant, chip) shows the context binary's size and compile time (<graph>.compile.json) and its
metrics against the float model measured on the HTP emulator: cosine, SQNR, max abs and the score hook's task
metrics, next to the float model's own task metrics. A cell's measurement is read from its check report or
measurement memo when those were made from the same binary, evaluation set and hooks (digests compared);
only a cell without one (e.g. its check never ran, or failed its gate) runs on the emulator here. A cell that
fails its gate is shown as failing, with its numbers, instead of stopping the report.
"""
from __future__ import annotations

import json
from pathlib import Path

from .. import gates, results
from ..toolchains.qnn_graph import combine, describe as describe_float_ops
from ..files import atomic_write_json, atomic_write_text
from .check import measurement, measurement_key, summarize

VERSION = 2  # 2: a failed model-level evaluation is shown (from its memo), marked FAIL


def _cell_metrics(cell: dict, hooks: str, data_dir) -> tuple[dict, str]:
    """(metrics, where they came from) for one cell."""
    key = measurement_key(cell["ctx_model"], cell["evaluation"], hooks, data_dir)
    try:
        check = json.loads(Path(cell["check"]).read_text())
        if check.get("inputs") == key:
            return {k: v for k, v in check.items() if k in ("samples", "outputs", "score", "float_score")}, "check"
    except (OSError, ValueError):
        pass
    try:
        remembered = json.loads(Path(cell["memo"]).read_text()).get("key") == key
    except (OSError, ValueError, AttributeError):
        remembered = False
    metrics, _ = measurement(cell["ctx_model"], cell["evaluation"], hooks, cell["graph"], data_dir, cell["memo"])
    return metrics, "memo" if remembered else "emulator"


def _compiled(path: str | list) -> dict:
    """A binary's compile report; a split graph's parts summed, with each part's size."""
    if not isinstance(path, list):
        return json.loads(Path(path).read_text())
    reports = [json.loads(Path(p).read_text()) for p in path]
    return {"bytes": sum(r["bytes"] for r in reports), "seconds": sum(r["seconds"] for r in reports),
            "part_bytes": [r["bytes"] for r in reports], "float_ops": combine([r.get("float_ops") for r in reports])}


def run(params: dict) -> dict:
    rows = []
    measured = 0
    for cell in params["cells"]:
        compiled = _compiled(cell["compile"])
        metrics, source = _cell_metrics(cell, params["hooks"], params.get("data_dir"))
        measured += source == "emulator"
        summary = summarize(metrics)
        print(f"{cell['variant']}@{cell['chip']} {cell['graph']}: {source}", flush=True)
        rows.append({"variant": cell["variant"], "chip": cell["chip"], "graph": cell["graph"],
                     "bytes": compiled["bytes"], "compile_seconds": compiled["seconds"], "samples": metrics["samples"],
                     **({"part_bytes": compiled["part_bytes"]} if "part_bytes" in compiled else {}),
                     "summary": summary, "float_score": metrics.get("float_score", {}), "gates": cell["gates"],
                     "gated": gates.results(cell["gates"], summary, metrics.get("float_score", {})),
                     "passed": gates.passes_all(cell["gates"], summary, metrics.get("float_score", {})),
                     "measured_by": source, "float_ops": compiled.get("float_ops")})
    report = {"model": params["model"], "toolchain": params["toolchain"], "variants": params["variants"],
              "cells": rows, "evaluate": evaluations(params.get("evaluations", {})), "quantizers": quantizers(params)}
    from ..device import results as device_results  # issue 29: the phones' device checks beside the emulator
    report["devices"] = device_results.report_rows(params["cells"], rows)
    report["device_timings"] = device_results.timing_rows(params["cells"])
    atomic_write_json(params["outputs"]["json"], report)
    atomic_write_text(params["outputs"]["markdown"], markdown(report))
    plot(report, params["outputs"]["png"])
    return {"cells": len(rows), "measured": measured}


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
            values.append(" / ".join(_fmt(r["summary"].get(m)) for m in _gated_metrics(rows, g)) if r else "–")
        failed = [g for g, r in cells.items() if r["passed"] is False]
        settings = report["variants"].get(variant, {})
        bits = "fp16" if settings.get("precision") == "fp16" else f"{settings.get('weights')}/{settings.get('activations')}"
        lines.append(f"| {variant} | {report.get('quantizers', {}).get(variant, '–')} | {bits} | {chip} | {size:.3f} | "
                     f"{seconds:.2f} | " + " | ".join(values)
                     + f" | {'FAIL: ' + ', '.join(failed) if failed else 'pass'} |")
    lines += ["", "## Per graph", "",
              "| variant | chip | graph | size (KB) | compile (s) | cosine | SQNR (dB) | max abs | task metrics | gate "
              "| float ops |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s = r["summary"]
        size = f"{r['bytes'] / 1e3:.1f}" + (" (" + " + ".join(f"{b / 1e3:.1f}" for b in r["part_bytes"]) + ")"
                                              if r.get("part_bytes") else "")  # a split graph: each part's size
        lines.append(f"| {r['variant']} | {r['chip']} | {r['graph']} | {size} | "
                     f"{r['compile_seconds']:.2f} | {_fmt(s['cosine'], 6)} | {_fmt(s['sqnr'])} | {_fmt(s['max_abs'])} | "
                     f"{_task_metrics(r)} | {_gate_text(r)} | {_float_text(r)} |")
    if report.get("evaluate"):
        lines += ["", "## Model-level evaluation", "", "| variant@chip | metrics | gate |", "|---|---|---|"]
        for name, value in report["evaluate"].items():
            gate = "–" if not value.get("gates") or value.get("passed") is None else \
                ("pass" if value["passed"] else f"**FAIL** ({value.get('error', '').split(': ', 1)[-1]})")
            lines.append(f"| {name} | {json.dumps(value.get('summary', value.get('metrics', value)))[:200]} | {gate} |")
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

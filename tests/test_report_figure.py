"""The report's figure (stages/report.py figure()): a readable 1200 x 700 picture of the gated metrics per variant
and chip with each gate's threshold, and the phones' latency beside the CPU baseline where a profile measured it.
Checked as a person would read it, through matplotlib's own objects: the PNG's pixel size, the title, each panel's
title and axis labels, the legend entries, and that no text reaches past the figure's edge (clipped)."""
from __future__ import annotations

import pytest

VARIANTS = ("fp16", "w8a16", "w8a8", "w4a16")
CHIPS = ("SM8550", "SM8650", "SM8750", "SM8850")


def _gated(value, low=None, high=None, ref=None):
    passed = (low is None or value >= low) and (high is None or value <= high)
    return {"metric": None, "value": value, "low": low, "high": high, "float": ref, "passed": passed}


def synthetic_report(extra: str = "") -> dict:
    """Two graphs: det gated on text_iou (absolute) and line_recall (relative to float); rec without gates (its
    cosine); w4a16 fails text_iou on every chip; one cell not measured yet. extra: "profile" adds the phones'
    latencies, "evaluate" a model-level gate (wer, at most 0.03 above float's)."""
    cells = []
    for v, variant in enumerate(VARIANTS):
        for chip in CHIPS:
            iou = 0.999 - 0.04 * v  # w4a16: 0.879, below 0.9
            recall = 0.82 - 0.01 * v
            det = [{**_gated(iou, low=0.9), "metric": "text_iou"},
                   {**_gated(recall, low=0.77, ref=0.82), "metric": "line_recall"}]
            measured = not (variant == "w8a8" and chip == "SM8850")
            cells.append({"graph": "det", "variant": variant, "chip": chip, "gated": det if measured else [],
                          "gates": [{"metric": "text_iou", "min": 0.9},
                                    {"metric": "line_recall", "max_decrease": 0.05}],
                          "summary": {"text_iou": iou, "line_recall": recall, "cosine": 0.99} if measured else {},
                          "measured_by": "check" if measured else "not measured", "passed": None})
            cells.append({"graph": "rec", "variant": variant, "chip": chip, "gated": [], "gates": [],
                          "summary": {"cosine": 0.9999 - 0.001 * v}, "measured_by": "check", "passed": None})
    timings, evaluate = [], {}
    if extra == "evaluate":
        evaluate = {f"{variant}@{chip}": {"metrics": {"wer": 0.05 + 0.01 * v}, "passed": True,
                                          "gated": [{"metric": "wer", "value": 0.05 + 0.01 * v, "low": None,
                                                     "high": 0.08, "float": 0.05, "passed": 0.05 + 0.01 * v <= 0.08}]}
                    for v, variant in enumerate(VARIANTS) for chip in CHIPS}
    if extra == "profile":
        timings = [{"kind": "profile", "variant": variant, "chip": "SM8750", "device": "s25",
                    "graphs": {"det": {"median_ms": 3.0 + v,
                                       "cpu": {"measured": variant == "fp16", "median_ms": 41.0}}}}
                   for v, variant in enumerate(VARIANTS)]
    return {"model": "densemap", "cells": cells, "evaluate": evaluate, "device_timings": timings}


def _texts(fig) -> list:
    return [t for t in fig.findobj(lambda a: hasattr(a, "get_text") and hasattr(a, "get_window_extent"))
            if t.get_text().strip() and t.get_visible()]


def _assert_nothing_clipped(fig):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    width, height = fig.canvas.get_width_height()
    for text in _texts(fig):
        box = text.get_window_extent(renderer)
        assert box.x0 >= -1 and box.y0 >= -1 and box.x1 <= width + 1 and box.y1 <= height + 1, \
            f"text {text.get_text()!r} is cut off at the figure's edge: {box}"


@pytest.mark.parametrize("extra", ["", "profile", "evaluate"])
def test_the_figure_shows_each_gated_metric_per_variant_and_chip_readably(tmp_path, extra):
    import matplotlib.pyplot as plt
    from PIL import Image

    from build_rules.stages.report import figure, plot

    report = synthetic_report(extra)
    fig = figure(report)
    try:
        assert fig._suptitle.get_text() == "densemap: gated metrics per variant and chip (HTP emulator vs float model)"
        axes = fig.get_axes()
        titles = [ax.get_title() for ax in axes]
        assert titles == ["det: text_iou", "det: line_recall", "rec: cosine"] + (
            {"profile": ["latency on phones (doit profile)"], "evaluate": ["model: wer"]}.get(extra, []))
        assert [ax.get_ylabel() for ax in axes[:3]] == ["text_iou (higher is better)", "line_recall (higher is better)",
                                                       "cosine"]
        for ax in axes[:3]:
            assert [t.get_text() for t in ax.get_xticklabels()] == list(VARIANTS)
        # the thresholds: text_iou's 0.9; line_recall's float 0.82 - 0.05 and the float model's own value
        lines = {ax.get_title(): sorted(round(l.get_ydata()[0], 6) for l in ax.get_lines()) for ax in axes[:3]}
        assert lines == {"det: text_iou": [0.9], "det: line_recall": [0.77, 0.82], "rec: cosine": []}
        legend = [t.get_text() for t in fig.legends[0].get_texts()]
        assert legend == [*CHIPS, "gate threshold", "float model", "gate failed", "not measured yet"]
        # a point per variant x chip: w4a16's four ringed red (failed), w8a8 on SM8850 a grey x (not measured)
        points = [(tuple(c.get_edgecolor()[0]) if len(c.get_edgecolor()) else None, len(c.get_offsets()))
                  for c in axes[0].collections]
        assert sum(n for _, n in points) == len(VARIANTS) * len(CHIPS)
        assert sum(edge == (1.0, 0.0, 0.0, 1.0) for edge, _ in points) == len(CHIPS)
        if extra == "evaluate":  # the [evaluate] gate: lower is better, its bound float + 0.03, w4a16 above it
            assert axes[3].get_ylabel() == "wer (lower is better)"
            assert sorted(round(line.get_ydata()[0], 6) for line in axes[3].get_lines()) == [0.05, 0.08]
            assert sum(len(c.get_offsets()) for c in axes[3].collections) == len(VARIANTS) * len(CHIPS)
        if extra == "profile":
            latency = axes[3]
            assert [t.get_text() for t in latency.get_yticklabels()] == [f"{v}@SM8750 det (s25)" for v in VARIANTS]
            assert latency.get_xlabel() == "median latency (ms)"
            assert [t.get_text() for t in latency.get_legend().get_texts()] == ["NPU (HTP)", "CPU baseline"]
        _assert_nothing_clipped(fig)
    finally:
        plt.close(fig)
    path = tmp_path / "report.png"
    plot(report, str(path))
    assert Image.open(path).size == ((1200, 700) if not extra else (1200, 1060))  # a second row of panels


def test_the_float_models_line_and_a_stopped_checks_points_are_in_view():
    """PP-OCR's line_recall (issue 44 item 4): the float model's value above every variant's and above the gate's
    bound was drawn outside the plotted range. A check stopped early shows the first samples' value, and says so
    beside its point on a chart of four chips too."""
    import matplotlib.pyplot as plt

    from build_rules.stages.report import figure
    report = synthetic_report()
    for cell in report["cells"]:
        for gate in cell["gated"]:
            if gate["metric"] == "line_recall":  # float 0.97, at most 0.2 below it: a bound of 0.77
                gate["float"] = 0.97
        if cell["graph"] == "det" and cell["variant"] == "w4a16" and cell["chip"] == "SM8650":
            cell["partial"] = {"samples": 1, "of": 6, "failed": ["text_iou at most 0.88 ..."]}
    fig = figure(report)
    try:
        recall = next(ax for ax in fig.get_axes() if ax.get_title() == "det: line_recall")
        low, high = recall.get_ylim()
        assert low < 0.77 and 0.97 < high  # the gate's bound and the float model's dotted line, both in view
        assert sorted(round(line.get_ydata()[0], 6) for line in recall.get_lines()) == [0.77, 0.97]
        iou = next(ax for ax in fig.get_axes() if ax.get_title() == "det: text_iou")
        assert [t.get_text() for t in iou.texts] == ["1 of 6 samples"]  # four chips: no other value is written
        _assert_nothing_clipped(fig)
    finally:
        plt.close(fig)

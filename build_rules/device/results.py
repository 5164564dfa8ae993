"""The device checks' results where other stages show them: `doit report` (a table beside the emulator's numbers)
and the dist bundle's index.json (per chip, per graph, per phone). Standard library only: the report, dist and
their task generators import this; it reads the <graph>.device.<device>.json files the device check writes."""
from __future__ import annotations

from pathlib import Path

from .devices import check_results


def result_files(chip_dir: str | Path, graphs) -> list[str]:
    """The device results present now (a task generator's file_dep: a new result re-makes the report/bundle)."""
    return [str(p) for g in graphs for p in sorted(Path(chip_dir).glob(f"{g}.device.*.json"))]


def report_files(chip_dir: str | Path, graphs) -> list[str]:
    """Every device result the report shows, of one variant's chip folder (device checks, profile, power)."""
    return result_files(chip_dir, graphs) + measured_files(chip_dir)


def _brief(result: dict) -> dict:
    return {"phone_model": result.get("phone_model"), "fingerprint": result.get("fingerprint"),
            "runtime": result.get("runtime"), "binary_sha256": result.get("binary_sha256"),
            "samples": result.get("samples"), "summary": result.get("summary"), "gated": result.get("gated"),
            "passed": result.get("passed"), **({"stale": result["stale"]} if result.get("stale") else {})}


def mark_stale(path: str | Path, result: dict, error: str) -> None:
    """A run that failed keeps the last good result (issue 37: it was deleted), marked as not of the current binary,
    runtime or phone build: `stale` says when and why; the next good run replaces the file."""
    import time

    from ..plumbing.files import atomic_write_json
    lines = [line.strip() for line in error.splitlines() if line.strip()] or ["no message"]
    said = next((line for line in lines if "ERROR" in line or line.startswith("<E>")), lines[0])  # the tool's own
    atomic_write_json(path, {**result, "stale": {"since": time.strftime("%Y-%m-%d %H:%M:%S"),
                                                 "why": f"the last run failed: {said[:300]}"}})


def report_rows(cells: list[dict], rows: list[dict]) -> list[dict]:
    """One row per (cell, phone): the emulator's summary beside the phone's."""
    found = []
    for cell, row in zip(cells, rows):
        chip_dir = Path(cell["check"]).parent
        for device, result in check_results(chip_dir, cell["graph"]).items():
            found.append({"variant": cell["variant"], "chip": cell["chip"], "graph": cell["graph"], "device": device,
                          "emulator": row["summary"], **_brief(result)})
    return found


def markdown(report: dict) -> list[str]:
    rows = report.get("devices") or []
    if not rows:
        return []
    lines = ["", "## On phones (`doit device_check:...`)", "",
             "| variant | chip | graph | emulator cosine | phone | phone model | build fingerprint | QNN runtime | "
             "phone cosine | phone SQNR (dB) | gate on the phone |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        runtime = r.get("runtime") or {}
        gate = "; ".join(f"{'pass' if g['passed'] else '**FAIL**' if g['passed'] is False else '–'} ({g['gate']})"
                         for g in r.get("gated") or []) or "–"
        if r.get("stale"):  # an earlier binary/runtime/phone build's numbers: the last run failed
            gate += f" (stale since {r['stale']['since']}: the last run failed)"
        s = r.get("summary") or {}
        lines.append(f"| {r['variant']} | {r['chip']} | {r['graph']} | {_fmt(r['emulator'].get('cosine'), 6)} | "
                     f"{r['device']} | {r.get('phone_model') or '–'} | {r.get('fingerprint') or '–'} | "
                     f"{runtime.get('version') or '–'} {runtime.get('build_id') or ''} | {_fmt(s.get('cosine'), 6)} | "
                     f"{_fmt(s.get('sqnr'))} | {gate} |")
    return lines


def measured_files(chip_dir: str | Path) -> list[str]:
    """profile.<device>.json and power.<device>.json of a variant's chip folder (the report's file_dep)."""
    return [str(p) for kind in ("profile", "power") for p in sorted(Path(chip_dir).glob(f"{kind}.*.json"))]


def timing_rows(cells: list[dict]) -> list[dict]:
    """Per variant, chip and phone: profile's latencies per graph and power's drain (when measured)."""
    import json
    found, seen = [], set()
    for cell in cells:
        chip_dir = Path(cell["check"]).parent
        if chip_dir in seen:
            continue
        seen.add(chip_dir)
        for path in measured_files(chip_dir):
            kind, device = Path(path).name.split(".")[:2]
            try:
                data = json.loads(Path(path).read_text())
            except (OSError, ValueError):
                continue
            found.append({"kind": kind, "variant": cell["variant"], "chip": cell["chip"], "device": device,
                          **{k: data.get(k) for k in ("phone_model", "fingerprint", "perf_profile", "graphs", "npu",
                                                       "cpu", "seconds_per_path", "hold_fixed", "realtime")}})
    return found


def timing_markdown(report: dict) -> list[str]:
    rows = report.get("device_timings") or []
    lines = []
    profiles = [r for r in rows if r["kind"] == "profile"]
    if profiles:
        lines += ["", "## Latency on phones (`doit profile:...`)", "",
                  "I/O native: the binary's own input/output types, as an app feeds it; float32: qnn-net-run "
                  "quantizes on the phone's CPU. Load: cold is the first qnn-net-run after the push, warm a second "
                  "one. Peak memory: the qnn-net-run process's max RSS. Flags: a noisy spread (p90 / median) or a "
                  "throttled phone (thermal status).", "",
                  "| variant | chip | phone | graph | perf profile | I/O | cold load (ms) | warm load (ms) | "
                  "first (ms) | min (ms) | median (ms) | p90 (ms) | max (ms) | peak memory (MiB) | CPU baseline | flags |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in profiles:
            for graph, t in (r.get("graphs") or {}).items():
                cpu = t.get("cpu") or {}
                peak = t.get("peak_memory_kib")
                flags = "; ".join(f.split(":", 1)[0] for f in t.get("flags") or []) or "–"
                lines.append(f"| {r['variant']} | {r['chip']} | {r['device']} | {graph} | {r.get('perf_profile')} | "
                             f"{(t.get('io') or '–').split(':', 1)[0]} | {_fmt(t.get('load_ms'))} | "
                             f"{_fmt(t.get('warm_load_ms'))} | {_fmt(t.get('first_ms'))} | {_fmt(t.get('min_ms'))} | "
                             f"{_fmt(t.get('median_ms'))} | {_fmt(t.get('p90_ms'))} | {_fmt(t.get('max_ms'))} | "
                             f"{_fmt(peak / 1024 if peak else None)} | "
                             f"{_fmt(cpu.get('median_ms')) if cpu.get('measured') else 'not measured'} | {flags} |")
    ops = [(r, graph, t["top_ops"]) for r in profiles for graph, t in (r.get("graphs") or {}).items()
           if t.get("top_ops")]
    if ops:  # profiling level `detailed` (BUILD_RULES_PROFILING_LEVEL): the HTP's per-op cycles, median per run
        lines += ["", "Ops with the most accelerator cycles (profiling level detailed; share of the graph's "
                  "accelerator cycles):", "", "| variant | chip | phone | graph | op | cycles | share |",
                  "|---|---|---|---|---|---|---|"]
        for r, graph, top in ops:
            lines += [f"| {r['variant']} | {r['chip']} | {r['device']} | {graph} | {op['op']} | {op['cycles']:.0f} | "
                      f"{_percent(op.get('share'))} |" for op in top[:5]]
    audio = [r for r in profiles if r.get("realtime")]
    if audio:
        lines += ["", "Real-time factor on phones (processing time / audio duration over the float evaluation's "
                  "audio, from the medians above; first output: one run of each graph in the order the evaluate "
                  "hook runs them):", "",
                  "| variant | chip | phone | audio (s) | graph runs | processing (ms) | RTF | first output (ms) |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in audio:
            a = r["realtime"]
            if not a.get("measured"):
                lines.append(f"| {r['variant']} | {r['chip']} | {r['device']} | not measured: {a.get('reason')} "
                             "| – | – | – | – |")
                continue
            runs = ", ".join(f"{g} x{n}" for g, n in a["graph_runs"].items())
            lines.append(f"| {r['variant']} | {r['chip']} | {r['device']} | {_fmt(a['audio_seconds'])} | {runs} | "
                         f"{_fmt(a['processing_ms'])} | {_fmt(a['rtf'])} | {_fmt(a['first_output_ms'])} |")
    powers = [r for r in rows if r["kind"] == "power"]
    if powers:
        lines += ["", "## Power on phones (`doit power:...`)", "",
                  "| variant | chip | phone | path | seconds | %/h | mAh/h | process CPU % |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in powers:
            for path in ("npu", "cpu"):
                p = r.get(path) or {}
                if p.get("measured") is False:
                    lines.append(f"| {r['variant']} | {r['chip']} | {r['device']} | {path.upper()} | "
                                 "not measured | – | – | – |")
                    continue
                lines.append(f"| {r['variant']} | {r['chip']} | {r['device']} | {path.upper()} | "
                             f"{_fmt(p.get('seconds'))} | {_fmt(p.get('percent_per_hour'))} | "
                             f"{_fmt(p.get('mah_per_hour'))} | {_fmt(p.get('cpu_percent_mean'))} |")
        lines += ["", "Held fixed for these numbers (power): " + "; ".join(powers[0].get("hold_fixed") or [])]
    return lines


def _percent(share) -> str:
    return "–" if share is None else f"{100 * share:.1f} %"


def _fmt(value, digits=4) -> str:
    return "–" if value is None else f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def bundle_entry(chip_dir: str | Path, graphs) -> dict:
    """graph -> device -> what the phone measured (index.json chips.<chip>.device_checks)."""
    found = {}
    for graph in graphs:
        results = check_results(chip_dir, graph)
        if results:
            found[graph] = {device: _brief(result) for device, result in results.items()}
    return found

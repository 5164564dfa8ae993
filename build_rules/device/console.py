"""One line per phone task for the build summary (summary.py): the device tasks run in doit's own process, where
doit keeps an action's prints to itself, so a task's numbers reach the console only through its values. Each
device task's last action reads the result its first action wrote and returns {"phone_summary": [lines]}.
Standard library only."""
from __future__ import annotations

import json
from pathlib import Path


def action(kind: str, params: dict) -> dict:
    try:
        result = json.loads(Path(params["outputs"]["result"]).read_text())
    except (OSError, ValueError):
        return {}
    return {"phone_summary": [f"{params['name']}: {LINES[kind](result)}"]}


def _ms(value) -> str:
    return "–" if value is None else f"{value:.3g} ms"


def _check(r: dict) -> str:
    gates = "; ".join(f"{'pass' if g['passed'] else 'FAILED' if g['passed'] is False else '–'} ({g['gate']})"
                      for g in r.get("gated") or []) or ("pass" if r.get("passed") else "FAILED")
    s = r.get("summary") or {}
    metrics = " ".join(f"{m} {s[m]:.6g}" for m in ("cosine", "sqnr") if isinstance(s.get(m), (int, float)))
    shown = (r.get("metrics") or {}).get("repeats") or {}
    repeated = {True: ", each run twice with the same bytes", False: ", NOT the same bytes on a second run"}.get(
        shown.get("repeats"), "")
    return (f"{gates}, {metrics} on {r.get('phone_model') or r.get('device')} over {r.get('samples')} "
            f"sample(s){repeated}")


def _profile(r: dict) -> str:
    parts = []
    for graph, t in (r.get("graphs") or {}).items():
        cpu = t.get("cpu") or {}
        text = f"{graph} median {_ms(t.get('median_ms'))} p90 {_ms(t.get('p90_ms'))}"
        text += f" (CPU {_ms(cpu.get('median_ms'))})" if cpu.get("measured") else " (CPU not measured)"
        if t.get("flags"):
            text += " [" + "; ".join(flag.split(":", 1)[0] for flag in t["flags"]) + "]"
        parts.append(text)
    io = {g: (t.get("io") or "").split(":", 1)[0] for g, t in (r.get("graphs") or {}).items()}
    return ", ".join(parts) + f"; {r.get('perf_profile')}, {'/'.join(sorted(set(io.values())))} I/O"


def _power(r: dict) -> str:
    paths = []
    for path in ("npu", "cpu"):
        p = r.get(path) or {}
        if p.get("measured") is False:
            paths.append(f"{path.upper()} not measured")
        elif p:
            mah = p.get("mah_per_hour")
            paths.append(f"{path.upper()} {'–' if mah is None else f'{mah:.4g}'} mAh/h over {p.get('seconds')} s")
    return ", ".join(paths) or "no paths measured"


LINES = {"device_check": _check, "profile": _profile, "power": _power}

"""The model's own gate in `doit tune` (not a stage): the [evaluate] gate (e.g. Whisper's WER) judged on the
proposal's binaries, and the graphs' targets tightened when it misses.

Tune searches per graph, against each graph's target (its check's gate: an output cosine). A model whose graphs
work together can meet every graph's target and still fail its own gate: Whisper tiny.en's tune (run 7,
docs/benchmarks.md) proposed an encoder at cosine 0.99635 and a decoder at 0.98216, both over their gates as built,
and the build's evaluate gave WER 0.625 on the first clip (float 0.053): greedy decoding went off track on a step
the decoder's 12 evaluation steps do not hold. So the proposal's binaries, built as the build builds them
(tune_confirm.py), are also evaluated as the evaluate stage evaluates them (its hooks, its early verdict), and when
the model's gate misses, each graph tune mixed gets a stricter target, part of the way from what its proposal gave
towards what every candidate at 16 bit gives (tighten), and is searched again (its ranking, CPU model and emulator
measurements are kept: only new sets are measured); the last round asks for the all-16-bit value itself. A model
whose gate even that misses fails the task with the numbers.
"""
from __future__ import annotations

import time

from ...errors import BuildError
from ...measuring import gates

# Rounds of tighter targets after the model's gate missed; round r closes this part of the gap between the proposal
# and all at 16 bit (the last: all of it, so the search ends at every candidate at 16 bit if nothing less will do).
STEPS = (0.5, 1.0)


class Missed(BuildError):
    """A proposal whose graphs meet their targets while the model's gate misses (tune goes on searching)."""


def evaluate(params: dict, binaries: dict[str, str]) -> dict:
    """{"metrics", "gated", "passed", "seconds"[, "partial"]} of the model's [evaluate] hooks on the emulator over
    `binaries` (graph -> context model), judged against params["evaluate"]["gates"] as the evaluate stage judges
    them (a per-sample hook with bound() stops at a decided miss: "partial" says after how many samples)."""
    from .. import evaluate as evaluate_stage
    config = params["evaluate"]
    names = {"model": params["model"], "variant": params["new_name"], "chip": params["chip"]["name"]}
    run = {"hooks": params["hooks"], "graphs": binaries, "on": "emulator", "gates": config["gates"],
           "float_report": config["float_report"], "name": f"{params['name']} as built", "names": names,
           **({"data_dir": params["data_dir"]} if params.get("data_dir") else {})}
    started = time.perf_counter()
    metrics, _, partial = evaluate_stage.measure(run)
    gated = gates.results(config["gates"], metrics, evaluate_stage.float_metrics(run), stopped=partial)
    if partial:
        passed = False
        for entry in gated:  # the early verdict's reason, for the log and the comment
            failed = next((f for f in partial["failed"] if f["metric"] == entry["metric"]), None)
            if failed:
                entry.update(passed=False, early=f"{failed['failure']}, after {partial['samples']} of "
                                                 f"{partial['of']} samples")
    else:
        passed = all(entry["passed"] for entry in gated)
    return {"metrics": metrics, "gated": gated, "passed": passed, "seconds": round(time.perf_counter() - started, 1),
            **({"partial": {"samples": partial["samples"], "of": partial["of"]}} if partial else {})}


def describe(result: dict) -> str:
    """'wer = 0.625 (float 0.0526), gate wer <= float + 0.05: misses (wer at least 0.154 whatever the other 3
    samples give, needs <= 0.1026, after 1 of 4 samples)'."""
    parts = []
    for entry in result["gated"]:
        value = "not measured" if entry["value"] is None else f"{entry['metric']} = {entry['value']:.6g}"
        value += f" (float {entry['float']:.6g})" if entry.get("float") is not None else ""
        verdict = "meets" if entry["passed"] else \
            f"misses ({entry['early']})" if entry.get("early") else \
            "misses" if entry["value"] is not None else f"not judged ({entry.get('failure', '')})"
        parts.append(f"{value}, gate {entry['gate']}: {verdict}")
    return "; ".join(parts)


def tighten(target, proposal: dict, all_16bit: dict, step: float):
    """The graph's target with each absolute gate ("min" / "max") moved `step` of the way from the proposal's value
    towards the value of every candidate at 16 bit (never looser than it was); None when no gate can move (the
    proposal is at all-16-bit's value already, or its gates are relative)."""
    moved = []
    for gate in gates.as_list(target):
        key, metric = gates.bound_key(gate), gate["metric"]
        better = {"min": 1.0, "max": -1.0}.get(key)  # which way is stricter; None: relative, left as it is
        if better and metric in proposal and metric in all_16bit:
            now, best = float(proposal[metric]), float(all_16bit[metric])
            goal = round(now + step * (best - now), 6)
            # (a proposal at or past all-16-bit's value: nothing left to ask of this gate)
            if (best - now) * better > 0 and (goal - gate[key]) * better > 0:
                moved.append({**gate, key: goal})
                continue
        moved.append(gate)
    if moved == gates.as_list(target):
        return None
    return moved if isinstance(target, list) else moved[0]


def comment_lines(result: dict | None, rounds: list[dict]) -> list[str]:
    """The proposal's comments on the model's gate: its value on the proposal's binaries, and each round that
    tightened graph targets after a miss."""
    lines = []
    for r in rounds:
        lines.append(f"# The model's gate missed on the proposal before (round {r['round']}: {r['missed']}): "
                     + "; ".join(f"{g}'s target {t['from']} -> {t['to']}" for g, t in r["targets"].items()))
    if result is not None:
        lines.append(f"# The model's own gate on those binaries ([evaluate], its hooks on the emulator, "
                     f"{result['seconds']:.0f} s): {describe(result)}")
    return lines

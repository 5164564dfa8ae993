"""Tune (ort-qnn, `doit tune:<model>/<variant>`): the cheapest mixed precision that meets each graph's target.

Cheapest = fewest activation tensors at 16 bit (the rest 8 bit; the variant's weights, per-channel and calibration
stay). Per graph, on the HTP emulator for the tuning chip:
1. the variant with every candidate at 8 bit, on the full evaluation set: if it meets the target, no tensor is needed;
2. every candidate at 16 bit: if even that misses the target, the stage fails (activations alone cannot get there);
3. backward elimination in the order of the sensitivity ranking (the sensitivity task's result when it is current,
   else measured here: cost only), least costly first: a tensor goes back to 8 bit
   when the target still holds without it (on the evenly spaced tuning samples); every step is measured, so
   interactions between tensors are accounted for, unlike a cut of the ranking;
4. the result on the full evaluation set; while it misses, the most sensitive removed tensor comes back.
Writes <variant>.tuned.toml (a [variants.<name>] section, with the measured numbers as comments, for the user to
keep: `python -m build_rules.tuning apply ...`) and <variant>.tuned.json.

It also reads what the build measured for the variant on every chip (each check's last result, a failed one from its
memo: build_rules/results.py) into its log, and warns when a graph meets its target on the tuning chip while its
check failed on another chip: a search on the tuning chip then finds nothing to fix. (Only the log and the warning:
the outputs depend on the task's inputs alone.)
"""
from __future__ import annotations

import json
import re
import time

from pathlib import Path

from .. import gates, layout, progress, results
from ..errors import BuildError
from ..files import atomic_write_json, atomic_write_text
from .precision import Candidates, clean, describe, meets
from .precision import search as search_full
from .sensitivity import ranking as sensitivity_ranking
from . import tune_ladder

VERSION = 1


def run(params: dict) -> dict:
    started = time.perf_counter()
    ladder = tune_ladder.search(params)  # whole variants across quantizers and bit widths, before 16-bit tensors
    if ladder["chosen"]:
        return tune_ladder.write(params, ladder, started)
    found, warnings = {}, []
    for graph in params["graphs"]:  # the ladder's measurements of the variant are reused
        built = as_built(params["model"], params["variant"], graph["name"])
        found[graph["name"]] = _tune_graph(graph, dict(params, _candidates=ladder["candidates"]), built)
        warnings += _other_chips_fail(graph["name"], found[graph["name"]], built, params)
    tuned = {"model": params["model"], "variant": params["variant"], "name": params["new_name"],
             "chip": params["chip"], "model_toml": params["model_toml"], "graphs": found,
             "seconds": round(time.perf_counter() - started, 1), **tune_ladder.summary(ladder, found, params)}
    atomic_write_text(params["outputs"]["toml"], toml_section(tuned, params))
    atomic_write_json(params["outputs"]["json"], {k: v for k, v in tuned.items() if k != "ladder_comments"})
    for warning in warnings:
        print(f"warning: {warning}", flush=True)
    return {g: len(r["sixteen_bit"]) for g, r in found.items()} | ({"warnings": warnings} if warnings else {})


def as_built(model: str, variant: str, graph: str) -> dict:
    """chip -> the last check result of the built variant's binary for `graph` (passed or failed, its gate and
    summary metrics), for every chip folder the build made."""
    folder = Path(layout.model_dir(model)) / variant
    found = {}
    for chip_dir in sorted(p for p in folder.glob("*") if p.is_dir()):
        result = results.last(str(chip_dir / f"{graph}.check.json"))
        if result is not None:
            found[chip_dir.name] = {"passed": result["passed"], "gates": result.get("gates", []),
                                    "summary": result.get("summary", {}),
                                    **({"error": result["error"]} if "error" in result else {})}
    return found


def _other_chips_fail(graph: str, result: dict, built: dict, params: dict) -> list[str]:
    failing = [chip for chip, r in built.items() if r["passed"] is False]
    chip = params["chip"]["name"]
    if not failing or chip in failing or result.get("sixteen_bit"):
        return []
    return [f"{params['name']}: {graph} meets its target on the tuning chip {chip}, but its check failed on "
            f"{', '.join(failing)} ({built[failing[0]].get('error', 'gate failed').split(': ', 1)[-1]}): to tune "
            f"for that chip, set chip = \"{failing[0]}\" under [tuning] in {params['model_toml']}"]


def _tune_graph(graph: dict, params: dict, built: dict) -> dict:
    name, target = graph["name"], graph["target"]
    if not target:
        print(f"{name}: no target (no gate and no [tuning] target): left as it is", flush=True)
        return {"target": None, "sixteen_bit": [], "note": "no target"}
    for chip, r in built.items():  # what the build measured, before this search
        verdict = {True: "passed", False: "FAILED", None: "not run"}[r["passed"]]
        print(f"{name}: as built on {chip}: check {verdict}" + (f" ({r['error'].split(': ', 1)[-1]})"
                                                                 if "error" in r else ""), flush=True)
    c = params.get("_candidates", {}).get(name) or \
        Candidates(graph, params["chip"], params["samples"], params["hooks"], params.get("data_dir"))
    progress.watch(lambda: c.evaluations, f"{name}: emulator measurements")  # a search: no total known ahead
    base = c.measure(set(), full=True)
    result = {"target": target, "candidates": len(c.candidates), "base": clean(base),
              "float_score": base.get("_float_score", {})}
    print(f"{name}: target {describe(target)}; {params['variant']}: {_value(target, base)}", flush=True)
    if meets(target, base):
        result.update(sixteen_bit=[], tuned=clean(base), note="the variant already meets the target")
        return _done(result, c)
    ranking, source = sensitivity_ranking(c, params["hooks"], graph.get("sensitivity"))
    result["ranking"] = source
    print(f"{name}: ranking from {source}", flush=True)
    everything = set(ranking)
    top = c.measure(everything, full=True)
    result["all_16bit"] = clean(top)
    print(f"{name}: all {len(ranking)} candidates at 16 bit: {_value(target, top)}", flush=True)
    if not meets(target, top):
        raise BuildError(f"{params['name']}: {name}: even with all {len(ranking)} activation tensors at 16 bit, "
                         f"{_value(target, top)} misses the target {describe(target)} on {params['chip']['name']}; "
                         "relax the target, or change weights / per_channel / calibration of the variant")
    kept = set(ranking)
    removed = []
    full = search_full(c, target)
    for tensor in reversed(ranking):  # least costly first
        trial = kept - {tensor}
        summary = c.measure(trial, full=full)
        if meets(target, summary):
            kept = trial
            removed.append(tensor)
        print(f"  {tensor}: {'8 bit' if kept == trial else 'stays 16 bit'} ({_value(target, summary)} "
              f"on {len(c.inputs) if full else len(c.subset)} samples)", flush=True)
    final = c.measure(kept, full=True)
    for tensor in [t for t in ranking if t in removed]:  # most sensitive first
        if meets(target, final):
            break
        kept.add(tensor)
        final = c.measure(kept, full=True)
        print(f"  full set misses: {tensor} back to 16 bit -> {_value(target, final)}", flush=True)
    if not meets(target, final):
        raise BuildError(f"{params['name']}: {name}: no mixed precision met {describe(target)} on the full set")
    result.update(sixteen_bit=[t for t in ranking if t in kept], tuned=clean(final))
    print(f"{name}: {len(kept)} of {len(ranking)} tensors at 16 bit: {_value(target, final)}", flush=True)
    return _done(result, c)


def _done(result: dict, c: Candidates) -> dict:
    result.update(evaluations=c.evaluations, emulator_seconds=round(c.seconds, 1), samples=len(c.subset),
                  full_samples=len(c.inputs))
    return result


def _value(target, summary: dict) -> str:
    """'cosine = 0.99912' (one per gate of the target)."""
    return ", ".join(f"{m} = {summary[m]:.5g}" for m in gates.metrics(target))


def _key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else _toml_string(name)


def _toml_string(text: str) -> str:
    return json.dumps(text)  # a JSON string is a valid TOML basic string


def toml_section(tuned: dict, params: dict) -> str:
    name, base, chip = tuned["name"], tuned["variant"], tuned["chip"]
    lines = [f"# Found by `doit tune:{tuned['model']}/{base}`: the fewest 16-bit activation tensors that meet each",
             f"# graph's target on the HTP emulator ({chip['name']}, soc {chip['soc_id']}), full evaluation set.",
             "# Other chips can differ slightly: the gate still checks every chip when you build it.",
             *tuned.get("ladder_comments", [])]
    for graph, r in tuned["graphs"].items():
        if not r.get("target"):
            lines.append(f"#   {graph}: no target, unchanged")
            continue
        line = f"#   {graph}: target {describe(r['target'])}: {base} {_value(r['target'], r['base'])}"
        if r["sixteen_bit"] or "all_16bit" in r:
            line += (f" -> {_value(r['target'], r['tuned'])} with {len(r['sixteen_bit'])} of {r['candidates']} "
                     f"activation tensors at 16 bit (all at 16 bit: {_value(r['target'], r['all_16bit'])})")
        else:
            line += " (already meets it)"
        lines.append(line)
    already_8_bit = all(g["variant"].get("activations") == "uint8" for g in params["graphs"])
    if already_8_bit and not any(r["sixteen_bit"] for r in tuned["graphs"].values()):
        # The tuned variant would be the variant itself: write no section, so `apply` adds no duplicate.
        lines += [f"# Nothing to add: {base} already meets every target with its 8-bit activations."]
        return "\n".join(lines) + "\n"
    lines += [f"# Keep it: python -m build_rules.tuning apply {params['final_outputs']['toml']}", "",
              f"[variants.{_key(name)}]", f"inherits = {_toml_string(base)}", 'activations = "uint8"', ""]
    for graph, r in tuned["graphs"].items():
        if r["sixteen_bit"]:
            pairs = ", ".join(f"{_toml_string(t)} = \"uint16\"" for t in r["sixteen_bit"])
            lines += [f"[variants.{_key(name)}.graphs.{_key(graph)}]", f"overrides = {{ {pairs} }}", ""]
    return "\n".join(lines)

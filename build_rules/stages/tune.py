"""Tune (ort-qnn, `doit tune:<model>/<variant>`): the cheapest mixed precision that meets each graph's target.

Cheapest = fewest activation tensors at 16 bit (the rest 8 bit; the variant's weights, per-channel and calibration
stay). Per graph, on the HTP emulator for the tuning chip, mixed_precision.search (its docstring has the steps of
[tuning] search = "bisect", the default, and "exhaustive"): the variant at 8 bit on the full evaluation set (if it
meets the target, no tensor is needed), every candidate at 16 bit (if even that misses, the stage fails), the search
on the evenly spaced tuning samples, and the result on the full evaluation set.
Writes <variant>.tuned.toml (a [variants.<name>] section, with the measured numbers as comments, for the user to
keep: `python -m build_rules.tuning apply ...`) and <variant>.tuned.json.
"""
from __future__ import annotations

import json
import re
import time

from ..files import atomic_write_json, atomic_write_text
from .mixed_precision import search
from .precision import describe

VERSION = 2


def run(params: dict) -> dict:
    started = time.perf_counter()
    results = {}
    for graph in params["graphs"]:
        results[graph["name"]] = search(graph, graph["target"], chip=params["chip"], samples=params["samples"],
                                        hooks=params["hooks"], data_dir=params.get("data_dir"),
                                        sensitivity=graph.get("sensitivity"), method=params["search"]["method"],
                                        budget=params["search"]["max_measurements"], variant=params["variant"],
                                        where=params["name"], log=_print)
    tuned = {"model": params["model"], "variant": params["variant"], "name": params["new_name"],
             "chip": params["chip"], "model_toml": params["model_toml"], "graphs": results,
             "seconds": round(time.perf_counter() - started, 1)}
    atomic_write_json(params["outputs"]["json"], tuned)
    atomic_write_text(params["outputs"]["toml"], toml_section(tuned, params))
    return {g: len(r["sixteen_bit"]) for g, r in results.items()}


def _print(line: str) -> None:
    print(line, flush=True)


def _key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else _toml_string(name)


def _toml_string(text: str) -> str:
    return json.dumps(text)  # a JSON string is a valid TOML basic string


def toml_section(tuned: dict, params: dict) -> str:
    name, base, chip = tuned["name"], tuned["variant"], tuned["chip"]
    lines = [f"# Found by `doit tune:{tuned['model']}/{base}`: the fewest 16-bit activation tensors that meet each",
             f"# graph's target on the HTP emulator ({chip['name']}, soc {chip['soc_id']}), full evaluation set.",
             "# Other chips can differ slightly: the gate still checks every chip when you build it."]
    for graph, r in tuned["graphs"].items():
        if not r.get("target"):
            lines.append(f"#   {graph}: no target, unchanged")
            continue
        metric = r["target"]["metric"]
        line = f"#   {graph}: target {describe(r['target'])}: {base} {r['base'][metric]:.5g}"
        if r["sixteen_bit"] or "all_16bit" in r:
            line += (f" -> {r['tuned'][metric]:.5g} with {len(r['sixteen_bit'])} of {r['candidates']} "
                     f"activation tensors at 16 bit (all at 16 bit: {r['all_16bit'][metric]:.5g})")
        else:
            line += " (already meets it)"
        lines.append(line)
        if "evaluations" in r:
            cpu = f", {r['cpu_evaluations']} CPU QDQ runs" if r.get("cpu_evaluations") else ""
            lines.append(f"#     search {r.get('search', 'exhaustive')}: {r['evaluations']} emulator measurements "
                         f"({r['emulator_seconds']:.0f} s){cpu}")
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

"""Tune (ort-qnn, `doit tune:<model>/<variant>`): the cheapest mixed precision that meets each graph's target.

Cheapest = fewest activation tensors at 16 bit (the rest 8 bit; the variant's weights, per-channel and calibration
stay). Per graph, on the HTP emulator for the tuning chip, mixed_precision.search (its docstring has the steps of
[tuning] search = "bisect", the default, and "exhaustive"): the variant at 8 bit on the full evaluation set (if it
meets the target, no tensor is needed), every candidate at 16 bit (if even that misses, the stage fails), the search
on the evenly spaced tuning samples, and the result on the full evaluation set. Last, the proposal is built as the
build will build it and measured on the whole evaluation set (support/tune_confirm.py): its numbers go into the
comments, and a proposal that misses then is not written.
Writes <variant>.tuned.toml (a [variants.<name>] section, with the measured numbers as comments, for the user to
keep: `python -m build_rules.tuning apply ...`) and <variant>.tuned.json.

It also reads what the build measured for the variant on every chip (each check's last result, a failed one from its
memo: build_rules/build_state/results.py) into its log, and warns when a graph meets its target on the tuning chip while its
check failed on another chip: a search on the tuning chip then finds nothing to fix. (Only the log and the warning:
the outputs depend on the task's inputs alone.)
"""
from __future__ import annotations

import json
import re
import time

from pathlib import Path

from ..build_state import layout, results
from ..plumbing.files import atomic_write_json, atomic_write_text
from .support.mixed_precision import search
from .support.precision import clean, describe, values
from ..errors import BuildError
from .support import cpu_search, tune_confirm, tune_ladder, tune_model_gate


def run(params: dict) -> dict:
    started = time.perf_counter()
    ladder = tune_ladder.search(params)  # whole variants across quantizers and bit widths, before 16-bit tensors
    if ladder["chosen"]:
        try:
            return tune_ladder.write(params, ladder, started)
        except tune_model_gate.Missed as missed:  # the model's gate decides: the mixed search goes on
            print(f"{params['name']}: the ladder's {missed}; the mixed-precision search runs", flush=True)
            ladder["chosen"] = None  # (the comments list that rung as missing, with why)
            ladder["notes"].append(f"the model's gate: {missed}")
    found, warnings, reuse = {}, [], {}
    for graph in params["graphs"]:  # the ladder's measurements of the variant are reused
        built = as_built(params["model"], params["variant"], graph["name"])
        reuse[graph["name"]] = {}  # its ranking, CPU model and measurements, for a search with a tighter target
        found[graph["name"]] = _tune_graph(graph, params, built, ladder["candidates"].get(graph["name"]),
                                           reuse[graph["name"]])
        warnings += _other_chips_fail(graph["name"], found[graph["name"]], built, params)
    tuned = {"model": params["model"], "variant": params["variant"], "name": params["new_name"],
             "chip": params["chip"], "model_toml": params["model_toml"], "graphs": found, "model_rounds": []}
    for step in (*tune_model_gate.STEPS, None):  # the proposal built; while the model's gate misses, tighter targets
        tuned.update(tune_ladder.summary(ladder, found, params))
        for graph, sizes in tuned.pop("all_16_smaller", {}).items():  # its upper end builds smaller than its mix
            found[graph] = tune_ladder.every_candidate(ladder, graph, found[graph], sizes)
        w16 = tuned.get("w8a16", {})
        # a mix no cheaper than W8A16: propose W8A16 itself
        tuned["w8a16_instead"] = "bytes" in w16 and tuned.get("mixed_bytes", 0) >= w16["bytes"]
        text = toml_section(tuned, params)
        if f"\n[variants.{_key(params['new_name'])}]" not in text:
            if not params.get("evaluate") or "model_gate" in tuned:
                break
            # every graph meets its target as the variant is: the model's gate is judged on the variant's own
            # binaries all the same (a WER can miss where each graph's cosine meets), and a miss tightens targets
            text = f"[variants.{_key(params['new_name'])}]\ninherits = {_toml_string(params['variant'])}\n"
        built = tune_confirm.build_and_measure(params, text)  # built as the build builds it
        tuned["as_built"], tuned["model_gate"] = built["graphs"], built["model"]
        if built["model"] is None or built["model"]["passed"]:
            break
        targets = _tighter_targets(params, found, step, reuse)
        if not targets:
            raise BuildError(_model_gate_failure(params, tuned, step))
        tuned["model_rounds"].append({"round": len(tuned["model_rounds"]) + 1,
                                      "missed": tune_model_gate.describe(built["model"]),
                                      "targets": {g: {"from": describe(found[g]["target"]), "to": describe(t)}
                                                  for g, t in targets.items()}})
        print(f"{params['name']}: the proposal meets every graph's target but misses the model's gate "
              f"({tune_model_gate.describe(built['model'])}): searched again with "
              + "; ".join(f"{g}'s target {describe(t)}" for g, t in targets.items()), flush=True)
        for graph in params["graphs"]:
            if graph["name"] in targets:
                found[graph["name"]] = _tune_graph({**graph, "target": targets[graph["name"]]}, params, {},
                                                   None, reuse[graph["name"]])
    text = toml_section(tuned, params)  # with what the last build gave
    tuned["seconds"] = round(time.perf_counter() - started, 1)
    atomic_write_text(params["outputs"]["toml"], text)
    atomic_write_json(params["outputs"]["json"], {k: v for k, v in tuned.items() if k != "ladder_comments"})
    for warning in warnings:
        print(f"warning: {warning}", flush=True)
    return {g: len(r["sixteen_bit"]) for g, r in found.items()} | ({"warnings": warnings} if warnings else {})


def _tighter_targets(params: dict, found: dict, step: float | None, reuse: dict) -> dict:
    """graph -> its stricter target for the next round (tune_model_gate.tighten), for each graph tune mixed (some
    tensors at 8 bit); {} after the last round or when no target can move. A graph that met its target at 8 bit has
    its every-candidate end measured now (its search stopped before it), with the Candidates it measured with, when
    no graph was mixed (the variant as it is missed the model's gate): else the mixed graphs' targets move."""
    if step is None:
        return {}
    targets, mixed = {}, any(r.get("sixteen_bit") for r in found.values())
    for graph in params["graphs"]:
        r = found[graph["name"]]
        c = reuse.get(graph["name"], {}).get("candidates")
        if r.get("target") and "all_16bit" not in r and not mixed and c is not None:
            r["all_16bit"] = clean(c.measure(set(c.candidates), full=True, end=True))
        if r.get("target") and "all_16bit" in r:
            tighter = tune_model_gate.tighten(r["target"], r["tuned"], r["all_16bit"], step)
            if tighter is not None:
                targets[graph["name"]] = tighter
    return targets


def _model_gate_failure(params: dict, tuned: dict, step) -> str:
    rounds = len(tuned["model_rounds"])
    done = f"after {rounds} round{'s' * (rounds != 1)} of tighter graph targets" if rounds else "at the graphs' targets"
    why = done + (", the last at what all candidates at 16 bit give" if step is None else
                  ", and no graph's target can be tightened further (each graph is at its all-16-bit value or was "
                  "not mixed, or its target is relative to float)")
    return (f"{params['name']}: the proposal {params['new_name']}, built as the build builds it, meets every graph's "
            f"target but misses the model's gate ([evaluate] in {params['model_toml']}): "
            f"{tune_model_gate.describe(tuned['model_gate'])}, {why}; nothing is written. The variant's weights "
            "or calibration (or a relaxed [evaluate] gate) must change: each graph's numbers are in this log")


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


def _tune_graph(graph: dict, params: dict, built: dict, candidates, reuse: dict) -> dict:
    """What the build measured on every chip (the log), then the search (mixed_precision.search)."""
    for chip, r in built.items():  # what the build measured, before this search
        verdict = {True: "passed", False: "FAILED", None: "not run"}[r["passed"]]
        print(f"{graph['name']}: as built on {chip}: check {verdict}" + (f" ({r['error'].split(': ', 1)[-1]})"
                                                                          if "error" in r else ""), flush=True)
    return search(graph, graph["target"], chip=params["chip"], samples=params["samples"], hooks=params["hooks"],
                  data_dir=params.get("data_dir"), sensitivity=graph.get("sensitivity"),
                  method=params["search"]["method"], budget=params["search"]["max_measurements"],
                  variant=params["variant"], where=params["name"], log=_print, candidates=candidates, reuse=reuse)


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
             "# Other chips can differ slightly: the gate still checks every chip when you build it.",
             *tuned.get("ladder_comments", [])]
    for graph, r in tuned["graphs"].items():
        if not r.get("target"):
            lines.append(f"#   {graph}: no target, unchanged")
            continue
        line = f"#   {graph}: target {describe(r['target'])}: {base} {values(r['target'], r['base'])}"
        if r["sixteen_bit"] or "all_16bit" in r:
            state = r.get("state_tensors", 0)  # a step graph's state inputs, 16 bit with the tensors they pair with
            inputs = r.get("graph_inputs_16", [])  # graph inputs the HTP needs at 16 bit beside their consumers
            line += (f" -> {values(r['target'], r['tuned'])} with {len(r['sixteen_bit']) - state - len(inputs)} of "
                     f"{r['candidates']} activation tensors at 16 bit"
                     + (f" and the {state} state tensors they pair with" if state else "")
                     + (f" and graph input{'s' if len(inputs) > 1 else ''} {', '.join(inputs)} (the HTP did not "
                        "build the mix with it at 8 bit)" if inputs else "")
                     + f" (all at 16 bit: {values(r['target'], r['all_16bit'])})")
        else:
            line += " (already meets it)"
        lines.append(line)
        if "evaluations" in r:
            cpu = f", {r['cpu_evaluations']} CPU QDQ runs" if r.get("cpu_evaluations") else ""
            cpu += f" ({r['cpu_remembered']} of them from an earlier tune)" if r.get("cpu_remembered") else ""
            kept = f", {r['emulator_remembered']} of them from an earlier tune" if r.get("emulator_remembered") else ""
            lines.append(f"#     search {r.get('search', 'exhaustive')}: {r['evaluations']} emulator measurements "
                         f"({r['emulator_seconds']:.0f} s{kept}){cpu}")
        if r.get("cpu_vs_emulator"):  # how well the CPU predicted the emulator at the points measured on both
            lines.append(f"#     the CPU against the emulator: {cpu_search.points_text(r['target'], r['cpu_vs_emulator'])}")
        if r.get("budget_spent"):
            b = r["budget_spent"]
            spent = (f"the CPU search stopped at its time budget ({b['cpu_seconds']:.0f} s, {b['cpu_measurements']} "
                     "measurements)" if "cpu_seconds" in b else
                     f"the CPU search stopped at its budget of {b['cpu_measurements']} measurements"
                     if "cpu_measurements" in b else
                     f"the emulator's {b['tries']} tries at fewer tensors (after it brought groups back) stopped at "
                     f"{b.get('seconds', 0):.0f} s" if "tries" in b else
                     f"the emulator's search stopped at [tuning] max_measurements = {b['max_measurements']}")
            lines.append(f"#     {spent} with {b['groups']} group(s) of up to {b['largest']} tensors left at 16 bit "
                         "untried: more of them may go to 8 bit")
    already_8_bit = all(g["variant"].get("activations") == "uint8" for g in params["graphs"])
    if already_8_bit and not any(r["sixteen_bit"] for r in tuned["graphs"].values()):
        # The tuned variant would be the variant itself: write no section, so `apply` adds no duplicate.
        lines += [f"# Nothing to add: {base} already meets every target with its 8-bit activations."]
        lines += tune_model_gate.comment_lines(tuned.get("model_gate"), [])
        return "\n".join(lines) + "\n"
    if tuned.get("w8a16_instead"):
        lines += [f"# No mix of 8 and 16 bit found is smaller than W8A16 here ({tuned['mixed_bytes'] / 1e3:.1f} KB "
                  f"against {tuned['w8a16']['bytes'] / 1e3:.1f} KB, measured above): the proposal is W8A16 itself"]
    lines += tune_confirm.comment_lines(tuned.get("as_built"), chip)
    lines += tune_model_gate.comment_lines(tuned.get("model_gate"), tuned.get("model_rounds", []))
    lines += [f"# Keep it: python -m build_rules.tuning apply {params['final_outputs']['toml']}", ""]
    if tuned.get("w8a16_instead"):
        return "\n".join(lines + tune_ladder.w8a16_section(_key(name), base, params["graphs"]))
    lines += [f"[variants.{_key(name)}]", f"inherits = {_toml_string(base)}", 'activations = "uint8"', ""]
    for graph, r in tuned["graphs"].items():
        if r["sixteen_bit"]:
            pairs = ", ".join(f"{_toml_string(t)} = \"uint16\"" for t in r["sixteen_bit"])
            lines += [f"[variants.{_key(name)}.graphs.{_key(graph)}]", f"overrides = {{ {pairs} }}", ""]
    return "\n".join(lines)

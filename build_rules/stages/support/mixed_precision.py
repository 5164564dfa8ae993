"""The mixed-precision search of `doit tune`, as one function (not a stage): the fewest 16-bit activation tensors of
one graph that meet a target on the HTP emulator. tune.py calls it per graph; an outer search (other weight settings,
quantization techniques) can call it per setting: `search(graph, target, ...)` -> result.

Two methods ([tuning] search):
- "bisect" (default), for graphs of hundreds of tensors. Every accepted step is an emulator measurement; the CPU only
  orders the work (research/ort-qnn.md §4: CPU QDQ and HTP disagree):
  1. order the candidates: the sensitivity task's ranking when it is current, else the CPU ranking (cpu_ranking.py:
     one CPU session, one run a tensor, no quantize or compile);
  2. forward along that order while the sets are small: the top 1, 2, 4, ... tensors at 16 bit (up to a quarter of
     them), and on a hit, halving between the last miss and the hit: the smallest such prefix, in about 2 log2(k)
     runs for k tensors. Small sets first because 16-bit activations can be slow on the emulator (a measurement
     of PP-OCRv4's detector with its activations at 16 bit takes ~24x one at 8 bit). No hit: the order is not
     telling, and the search starts from all the candidates;
  3. from that set, groups of tensors go back to 8 bit, halving: a group (in graph order) is dropped in one run when
     the target still holds without it, else its halves are tried later, largest groups first, down to single
     tensors or until max_measurements is spent (then the groups left stay 16 bit, and the log says so). A region
     the ranking is blind to (an HTP-only divergence) is a group the emulator refuses to drop: it is found in about
     2 log2(n) runs per region, wherever it is; when the search completes, every tensor left is needed (dropping it
     alone misses the target);
  Steps 2-3 run on the CPU switch model (cpu_search.py: seconds a measurement), judged with the margin the points
  measured on both set; the emulator confirms the proposal on the full evaluation set;
  4. when the emulator misses it: the groups the CPU put at 8 bit come back, those whose drop cost the most on the
     CPU first, halving on how many (_additions, _bring_back): on the CPU while its wider margin still lets all 16
     bit meet (up to CONFIRMATIONS proposals), else on the emulator, which then tries a few sets of those at 8 bit
     again (for up to REFINE_SECONDS of emulator time). Measured on Whisper's encoder: the CPU's 30-tensor
     proposal (0.99601 predicted) gave 0.99154 on the emulator, after which the emulator's own search from the top
     of the ranking ran for hours;
  5. the result on the full evaluation set; while it misses, the groups dropped last come back, then the rest of
     the ranking.
- "exhaustive": the search before "bisect": one emulator run per tensor for the ranking (unless the sensitivity
  task's is current), then one tensor at a time back to 8 bit, least costly first (2n runs). For comparisons.
"""
from __future__ import annotations

from ...measuring import gates
from ...quantization.dtypes import BY_NAME
from ...errors import BuildError
from .precision import Candidates, clean, describe, meets, values
from .precision import search as search_full

SEARCHES = ("bisect", "exhaustive")
CONFIRMATIONS = 3  # emulator checks of the CPU's proposals (each miss widens the margin) before the emulator brings back
CPU_MEASUREMENTS_PER_TENSOR = 4  # the CPU search's budget: group halving needs about 2 per tensor kept
# ... and its time: Whisper's encoder spent 11 min in CPU measurements of 4 clips (~3 s each) whose proposal the
# emulator then missed by 10x the CPU's error; the groups left unsplit stay 16 bit (the comment says so)
CPU_SEARCH_SECONDS = 180.0
# The emulator's tries to put tensors back at 8 bit after it brought groups back from a CPU proposal it missed (that
# set meets already): as many as start within this much emulator time (a tiny graph's take a second each; Whisper's
# encoder's ~40 s a miss stopped at its first clip, ~2.5 min a set that meets on all 4: run 7's 8 tries took 14.5 min
# for 24 of 132 tensors at 8 bit, ~0.1 % of the binary; run 8's first of 4 tries in 7 min put 16 of its 22 at 8 bit).
# At least one; none started that would end past it.
REFINE_SECONDS = 180.0


def search(graph: dict, target, *, chip: dict, samples: int, hooks: str, data_dir=None,
           sensitivity: str | None = None, method: str = "bisect", budget: int = 48, order: list[str] | None = None,
           variant: str = "the variant", where: str = "tune", log=print, candidates: Candidates | None = None,
           reuse: dict | None = None) -> dict:
    """graph: {"name", "onnx", "ranges", "evaluation", "variant": settings} (tuning_tasks._tuning_graph);
    target: a gate dict or a list of them, all to be met (gates.py judges them, through precision.meets), or None;
    candidates: the graph's Candidates when the caller has measured with them already (tune's ladder); budget: emulator measurements the
    bisect search may make between the all-16-bit check and the final check; order: a ranking to use instead of the
    sensitivity task's or the CPU's (candidates, most important first; others are appended in graph order);
    where: the task, for errors; reuse: a dict this search fills with its Candidates, ranking, CPU model and the
    points measured on both, and a later search of the same graph (a tighter target: tune_model_gate.py) starts from
    them: only sets not measured yet are measured.
    Returns the result written to <variant>.tuned.json:
    sixteen_bit (the tensors to override, in ranking order), base / all_16bit / tuned summaries (the emulator, full
    evaluation set), and how much was measured (evaluations, emulator_seconds on the emulator; cpu_evaluations,
    cpu_seconds on the CPU). Raises BuildError when even every tensor at 16 bit misses the target."""
    name = graph["name"]
    if not target:
        log(f"{name}: no target (no gate and no [tuning] target): left as it is")
        return {"target": None, "sixteen_bit": [], "note": "no target"}
    if method not in SEARCHES:
        raise ValueError(f"unknown search {method!r}; expected one of {', '.join(SEARCHES)}")
    reuse = {} if reuse is None else reuse
    c = reuse.get("candidates") or candidates or Candidates(graph, chip, samples, hooks, data_dir)
    reuse["candidates"] = c
    c.not_built_is_a_miss = True  # a trial the HTP does not build cannot ship: the search goes on past it
    from ...plumbing import progress
    progress.watch(lambda: c.evaluations, f"emulator measurements for {name}")  # a search: no total known ahead
    progress.stop("cpu ranking")  # the previous graph's CPU ranking and search: this graph's lines from here
    progress.stop("cpu")
    # A variant with 16-bit activations is (nearly) all candidates at 16 bit: when tune gets here it has usually
    # missed as built, so that measurement goes first and a miss ends the search before any 8-bit run (measured on
    # Whisper w4a16: the 8-bit start alone ran for over 25 min before it could say nothing helps).
    sixteen_bit_variant = BY_NAME[graph["variant"].get("activations", "uint8")].bits == 16
    if sixteen_bit_variant:
        _all_16bit(c, target, c.candidates, name, chip, where, log, first=True)
    base = c.measure(set(), full=True, target=target, end=True)  # a miss may stop early: only compared
    result = {"target": target, "search": method, "candidates": len(c.candidates), "base": clean(base),
              "float_score": base.get("_float_score", {})}
    log(f"{name}: target {describe(target)}; {variant} at 8-bit activations: {values(target, base)}")
    if meets(target, base):
        result.update(sixteen_bit=[], tuned=clean(base), note="the variant already meets the target")
        return _done(result, c)
    if "order" in reuse:
        order, source, cpu = reuse["order"], reuse["source"], reuse["cpu"]
    elif order is not None:
        order = [t for t in order if t in c.candidates]
        order, source, cpu = order + [t for t in c.candidates if t not in order], "given", None
    else:
        order, source, cpu = _order(c, hooks, sensitivity, method, log, target)
    reuse.update(order=order, source=source, cpu=cpu)
    result["ranking"] = source
    log(f"{name}: ranking from {source}")
    first = _concat_fixes(graph, c)
    if first:  # a Concat whose narrow input its scale crushes (quantize's warning): its fix is tried first
        order = first + [t for t in order if t not in first]
        log(f"{name}: first in the ranking, the fix of the quantize stage's Concat warning: {', '.join(first)}")
    top = _all_16bit(c, target, order, name, chip, where, log, said=sixteen_bit_variant)
    result["all_16bit"] = clean(top)
    c.ends_repeat(base, top)
    full = search_full(c, target)
    judge = None
    if method == "exhaustive":
        kept, dropped = _one_at_a_time(c, target, order, full, log)
        final = c.measure(kept, full=True, target=target)
    else:
        # 2-3 on the CPU switch model, judged with the margin its differences from the emulator set (cpu_search.py);
        # the emulator confirms the result on every sample, and a miss there widens the margin and brings groups back
        from . import cpu_ranking, cpu_search
        cpu = reuse["cpu"] = cpu or cpu_ranking.SwitchModel(c)
        progress.watch(lambda: cpu.evaluations, f"CPU measurements for {name}", slot="cpu")
        judge = cpu_search.Judge(cpu, target)
        everything = list(range(len(c.inputs)))
        judge.learn("the variant at 8 bit", set(), base, everything)
        judge.learn("all at 16 bit", set(order), top, everything)
        for point, sixteen, measured in reuse.get("proposals", []):  # an earlier search's: their margins hold
            judge.learn(point, sixteen, measured, everything)
        log(f"{name}: the CPU against the emulator: {judge.describe()}; a CPU number is judged with "
            + ", ".join(f"{m} {d:+.5g}" for m, d in judge.margin().items()))
        cpu_budget = CPU_MEASUREMENTS_PER_TENSOR * len(order)
        cpu_spent = _Budget(cpu, cpu_budget, CPU_SEARCH_SECONDS)
        spent = c.evaluations + budget  # the emulator's, if it has to search itself
        final = None
        if "kept" in reuse and not judge.meets(set(order)):
            # a tighter target (the model's gate missed: tune_model_gate.py) with a margin, learnt from earlier
            # proposals, that fails even all 16 bit on the CPU: its search would keep every tensor (Whisper's run 9:
            # both graphs went to all 16 bit). The last result, which the emulator measured, is the start instead,
            # and the emulator brings groups back from it.
            kept, dropped, left = set(reuse["kept"]), [list(g) for g in reuse["dropped"]], []
            proposer = "the last result"
            log(f"{name}: the CPU's margin fails even all {len(order)} at 16 bit: the search starts from the last "
                f"result ({len(kept)} tensors at 16 bit)")
        else:
            proposer = "the CPU's proposal"
            kept, dropped, left = _bisect(judge.meets, order, c.candidates, cpu_spent,
                                          log, top_meets=meets(target, top), where=" (CPU)",
                                          shown=lambda s: values(target, judge.predicted(cpu.measure(s))) +
                                          " predicted")
        if kept is None:
            raise BuildError(f"{where}: {name}: no mix of 8 and 16 bit met {describe(target)} on {chip['name']}: "
                             f"all {len(order)} candidates at 16 bit miss ({values(target, top)}), and the CPU "
                             f"judges the top 1 to {left[0]} of the ranking to miss too; relax the target, or "
                             "change weights / per_channel / calibration of the variant")
        if left:  # the proposal's comment says so: a larger budget may put more at 8 bit
            result["budget_spent"] = {"cpu_measurements": cpu_spent.measurements(), "groups": len(left),
                                      "largest": max(left), **({"cpu_seconds": CPU_SEARCH_SECONDS}
                                                               if cpu_spent.measurements() < cpu_budget else {})}

        def emulator_meets(sixteen) -> bool:
            return meets(target, c.measure(sixteen, full=True, target=target))

        def cpu_rules_out(sixteen) -> str | None:  # a miss even with the largest difference seen in its favour
            best = judge.optimistic(cpu.measure(sixteen))
            return None if meets(target, best) else f"ruled out on the CPU ({values(target, best)} at best)"

        for round_ in range(1, CONFIRMATIONS + 1):
            final = c.measure(kept, full=True, target=target)
            judge.learn(f"proposal {round_}", kept, final, everything)
            reuse.setdefault("proposals", []).append((f"an earlier proposal ({len(kept)} tensors)", set(kept), final))
            if meets(target, final) or not kept:
                break
            margin = ", ".join(f"{m} {d:+.5g}" for m, d in judge.margin().items())
            missed = (f"  the emulator misses {proposer} of {len(kept)} tensors ({values(target, final)} on "
                      "all samples)")
            if not meets(target, top):  # no upper end to bring groups back towards: the emulator searches
                log(f"{missed}: the emulator searches")
                kept, dropped, left = _bisect(emulator_meets, order, c.candidates, lambda: c.evaluations >= spent,
                                              log, top_meets=False, where=" (emulator)", ruled_out=cpu_rules_out,
                                              shown=lambda s: values(target, c.measure(s, full=True)))
                if kept is None:
                    kept, dropped = set(order), []
                if left:
                    result["budget_spent"] = {"max_measurements": budget, "groups": len(left), "largest": max(left)}
                final = c.measure(kept, full=True, target=target)
                break
            additions = _additions(cpu, target, kept, dropped, order)
            if round_ < CONFIRMATIONS and judge.meets(set(order)):
                # the margin that miss set still lets all 16 bit meet on the CPU: the CPU brings back, from the
                # groups it put at 8 bit, the fewest it now judges to meet with, and the emulator judges again
                log(f"{missed}: margin now {margin}; the CPU brings back groups it put at 8 bit")
                kept, dropped = _bring_back(judge.meets, kept, additions, log, where=" (CPU)")
                continue
            # the CPU cannot steer here (the margin fails even all 16 bit, or it ran out of rounds): the emulator
            # brings groups back from the CPU's proposal, halving (about log2 of the groups, a miss stops early),
            # then tries a few sets of those at 8 bit again (REFINE_SECONDS): the CPU's proposal is where to start, not
            # what to keep (a tensor it kept the HTP may not need)
            log(f"{missed} by more than the CPU can tell apart (margin {margin}): the emulator brings back groups "
                "the CPU put at 8 bit")
            start = set(kept)
            kept, dropped = _bring_back(emulator_meets, kept, additions, log, where=" (emulator)",
                                        ruled_out=cpu_rules_out)
            brought = [t for g in additions for t in g if t in kept and t not in start]
            refine = [*brought[::-1], *[t for t in order if t in start]]  # the group that tipped it first
            # within [tuning] max_measurements, at least one try
            refine_spent = _Budget(c, max(1, spent - c.evaluations), REFINE_SECONDS, at_least=1)
            if len(refine) > 1:
                log(f"  {len(kept)} tensors at 16 bit meet on the emulator; the emulator tries fewer for up to "
                    f"{REFINE_SECONDS:.0f} s")
                fewer, gone, left = _bisect(emulator_meets, refine, c.candidates, refine_spent,
                                            log, where=" (emulator)", ruled_out=cpu_rules_out,
                                            shown=lambda s: values(target, c.measure(s, full=True)))
                if left:  # the proposal's comment says so
                    result["budget_spent"] = {"tries": refine_spent.measurements(), "groups": len(left),
                                              "largest": max(left), "seconds": REFINE_SECONDS}
                if kept - fewer:
                    dropped.append([t for t in refine if t not in fewer])
                kept = fewer
            final = c.measure(kept, full=True, target=target)
            break
    # While the full set misses (the exhaustive search ran on the tuning samples; the CPU's margin ran out of
    # rounds), the groups dropped last come back on the emulator (the closest to the result), then the rest of the
    # ranking in doubling chunks.
    rest = [t for t in order if t not in kept and not any(t in g for g in dropped)]
    chunks = [rest[2 ** i - 1:2 ** (i + 1) - 1] for i in range(len(rest).bit_length())]
    for group in [*reversed(dropped), *chunks]:
        if meets(target, final):
            break
        kept |= set(group)
        final = c.measure(kept, full=True, target=target)
        log(f"  full set misses: {_names(group)} back to 16 bit -> {values(target, final)}")
    if not meets(target, final):
        raise BuildError(f"{where}: {name}: no mixed precision met {describe(target)} on the full set")
    # a step graph's state pairs the kept tensors touch are 16 bit too (precision.Candidates.closed): listed last
    # and the graph inputs the HTP needs at 16 bit beside them (precision.Candidates.inputs_at_16): listed apart
    reuse.update(kept=set(kept), dropped=[list(g) for g in dropped])  # a tighter target's search may start here
    sixteen, state, inputs = c.listed(kept, order)
    result.update(sixteen_bit=sixteen + state + inputs, state_tensors=len(state), tuned=clean(final))
    if inputs:
        result["graph_inputs_16"] = inputs
    if judge is not None:  # how well the CPU predicted the emulator where both measured
        result["cpu_vs_emulator"] = judge.points
    if cpu is not None:
        result.update(cpu_evaluations=cpu.evaluations, cpu_seconds=round(cpu.seconds + cpu.build_seconds, 1),
                      cpu_remembered=cpu.remembered)
    paired = (f" and the {len(state)} state tensors they pair with" if state else "") + \
        (f" and graph input{'s' if len(inputs) > 1 else ''} {', '.join(inputs)}" if inputs else "")
    log(f"{name}: {len(sixteen)} of {len(order)} tensors{paired} at 16 bit: {values(target, final)}")
    return _done(result, c)


def _all_16bit(c: Candidates, target, order: list[str], name: str, chip: dict, where: str, log,
               first: bool = False, said: bool = False) -> dict:
    """Every candidate at 16 bit on the full set (remembered: measured once however often asked). A miss does not
    end the search: a few tensors at 16 bit can meet where all of them do not (YOLOv8n: all 16 bit det_f1 0.857,
    the score Sigmoid and the output at 16 bit 0.971; a 16-bit binary that does not repeat itself is a miss), so the
    search goes on along the ranking and fails only when no mix it tries meets (_bisect). first: measured before the
    8-bit start (a 16-bit variant: its usual miss, the first thing to know); said: its numbers were logged then."""
    top = c.measure(set(order), full=True, target=target, end=True)
    if not said:
        log(f"{name}: all {len(order)} candidates at 16 bit: {values(target, top)}")
    if "not_built" in top:  # the upper end of every search: nothing below it can be judged against it
        raise BuildError(f"{where}: {top['not_built']}; so no mix of 8 and 16 bit is searched. A variant with 16-bit "
                         "activations throughout (activations = \"uint16\", its graph inputs too) may build where "
                         "this does not: tune's whole-variant ladder tries those first unless [tuning] try_variants "
                         "= false")
    if not meets(target, top) and not first:
        log(f"{name}: all at 16 bit misses {describe(target)} on {chip['name']}: the search tries small sets of the "
            "ranking all the same (fewer 16-bit tensors can do better)")
    return top


def _order(c: Candidates, hooks: str, sensitivity: str | None, method: str, log, target=None):
    """(candidates, most important first; where the order came from; the CPU model if one was built)."""
    from ..sensitivity import saved_ranking
    saved = saved_ranking(c, hooks, sensitivity)
    if saved:
        return saved, sensitivity, None
    if method == "exhaustive":
        from ..sensitivity import emulator_cost_ranking
        return emulator_cost_ranking(c), "measured (cost only, on the emulator)", None
    from . import cpu_ranking
    cpu = cpu_ranking.SwitchModel(c)
    rows = cpu_ranking.costs(cpu, c.candidates, target)
    on = (f" on the first of the {len(c.subset)} tuning samples (on all of them it would take over "
          f"{cpu_ranking.RANKING_SECONDS:.0f} s; the search runs on all)" if cpu.ranked_on < len(c.subset) else "")
    kept = f" ({cpu.remembered} of them measured by an earlier tune)" if cpu.remembered else ""
    log(f"{c.graph['name']}: CPU ranking: {cpu.evaluations} CPU QDQ runs{kept} in {cpu.seconds + cpu.build_seconds:.1f} "
        f"s{on}")
    return cpu_ranking.order(c.candidates, rows), "the CPU QDQ model (gain and cost per tensor)", cpu


def _concat_fixes(graph: dict, c: Candidates) -> list[str]:
    """The tensors quantize's Concat warnings say to keep at 16 bit (support/concat_slices.py: a YOLO export's box and
    score output), those that are candidates: an SQNR ranking puts them far down (YOLOv8n: the score Sigmoid 182nd of
    242), while their fix is what a task metric needs."""
    import json
    from pathlib import Path
    try:
        entries = json.loads(Path(graph["concats"]).read_text()).get("concats", []) if graph.get("concats") else []
    except (OSError, ValueError):
        return []
    found = [t for e in entries for t in (e.get("fix") or {}).get("overrides", []) if t in c.candidates]
    return list(dict.fromkeys(found))


def _one_at_a_time(c: Candidates, target, order: list[str], full: bool, log):
    kept, dropped = set(order), []
    for tensor in reversed(order):  # least costly first
        trial = kept - {tensor}
        summary = c.measure(trial, full=full, target=target)  # a miss may stop early (precision.py)
        if meets(target, summary):
            kept = trial
            dropped.append([tensor])
        log(f"  {tensor}: {'8 bit' if kept == trial else 'stays 16 bit'} ({values(target, summary)} "
            f"on {_samples(c, full)} samples)")
    # most sensitive first when the full set asks for tensors back: reversed(dropped) starts there
    return kept, dropped


def _bisect(holds, order: list[str], graph_order: list[str], spent, log, top_meets: bool = True,
            where: str = "", shown=None, ruled_out=None):
    """(kept, dropped groups, sizes of the groups left unsplit when the budget ran out): steps 2-3 of the module
    docstring. holds(sixteen) -> whether that set meets the target (the CPU judge, or the emulator); spent() -> whether
    the budget is spent; shown(sixteen) -> its numbers for the log. When all at 16 bit misses (top_meets false), the
    forward steps go on to every prefix of the ranking; when they all miss: (None, [], [the largest prefix tried]).
    ruled_out(sixteen) -> why a set is a miss without asking holds() (the CPU, when the emulator searches), or None."""
    def judged(sixteen: set) -> tuple[bool, str]:
        why = ruled_out(sixteen) if ruled_out else None
        return (False, why) if why else (holds(sixteen), "")

    def outcome(ok: bool) -> str:
        return "meets" if ok else "misses"

    n = len(order)
    # 2. forward along the ranking while the sets are small (16-bit activations are slow on the emulator)
    miss, hit, k = 0, None, 1
    while k <= (max(1, n // 4) if top_meets else n - 1) and not (top_meets and spent()):
        ok, why = judged(set(order[:k])) if order[:k] else (False, "")
        log(f"  top {k} of the ranking at 16 bit{where}: {why or outcome(ok) + ' the target'}")
        if ok:
            hit = k
            break
        miss, k = k, 2 * k
    if hit is None and not top_meets:
        return None, [], [miss]  # nothing met: the caller says so
    if hit is not None:
        while hit - miss > 1:
            mid = (miss + hit) // 2
            ok, why = judged(set(order[:mid]))
            log(f"  top {mid} of the ranking at 16 bit{where}: {why or outcome(ok) + ' the target'}")
            miss, hit = (miss, mid) if ok else (mid, hit)
        kept = set(order[:hit])
    else:
        kept = set(order)
        log(f"  even the top {miss} miss{where}: the search starts from all {n}")
    # 3. groups back to 8 bit, halving in graph order, largest groups first (so a budget cut leaves even groups)
    dropped: list[list[str]] = []
    members = [t for t in graph_order if t in kept]
    middle = len(members) // 2
    queue = [members[:middle], members[middle:]] if len(members) > 1 else []  # all of them: the base, a miss
    while queue and not spent():
        queue.sort(key=len, reverse=True)
        group = queue.pop(0)
        trial = kept - set(group)
        if trial and judged(trial)[0]:
            kept = trial
            dropped.append(group)
            log(f"  {_names(group)}: 8 bit{where}" + (f" ({shown(trial)})" if shown else ""))
        elif len(group) > 1:
            middle = len(group) // 2
            queue += [group[:middle], group[middle:]]
        else:
            log(f"  {group[0]}: stays 16 bit")
    if queue:
        log(f"  budget spent{where}: {len(queue)} group(s) of up to {max(map(len, queue))} tensors stay 16 bit "
            "unsplit")
    return kept, dropped, [len(group) for group in queue]


class _Budget:
    """spent() of a search measured by `meter` (its .evaluations and .clock so far: the seconds its measurements took
    when they ran, so that a second tune that remembers them stops where the first did): true once it has made `most`
    measurements from now, or, after at least `at_least` of them, once another one as long as those so far took on
    average would end past `seconds` from now (Whisper's encoder: its last try started at 4 min of a 5-minute budget
    and ended 2 min past it)."""

    def __init__(self, meter, most: int, seconds: float, at_least: int = 0):
        self.meter, self.most, self.seconds, self.at_least = meter, most, seconds, at_least
        self.start = (meter.evaluations, meter.clock)

    def measurements(self) -> int:
        return self.meter.evaluations - self.start[0]

    def __call__(self) -> bool:
        made = self.measurements()
        if made >= self.most:
            return True
        if made < self.at_least:
            return False
        used = self.meter.clock - self.start[1]
        return used + (used / made if made else 0.0) > self.seconds


def _additions(cpu, target, kept: set, dropped: list[list[str]], order: list[str]) -> list[list[str]]:
    """The groups the CPU search put at 8 bit, to bring back to 16 bit in this order: those whose drop cost the most
    on the CPU first (the HTP's own loss grows with the CPU's: Whisper's encoder, 1 - cosine 1.25x the CPU's at all
    16 bit, 2.3x at a 30-tensor mix), then the rest of the ranking (never in the set the groups left) in doubling
    chunks. Each drop's cost is measured again from the sets the search measured (memoized: no new CPU run)."""
    gate = gates.as_list(target)[0]
    better = gates.higher_is_better(gate)

    def value(sixteen) -> float:
        v = cpu.measure(sixteen).get(gate["metric"], 0.0)
        return v if better is not False else -v

    current, cost = set(kept).union(*map(set, dropped)), []
    for group in dropped:
        cost.append(value(current) - value(current - set(group)))
        current -= set(group)
    ranked = [g for _, _, g in sorted(zip(cost, range(len(dropped)), dropped), key=lambda x: (-x[0], x[1]))]
    rest = [t for t in order if t not in kept and not any(t in g for g in dropped)]
    return ranked + [rest[2 ** i - 1:2 ** (i + 1) - 1] for i in range(len(rest).bit_length())]


def _bring_back(holds, kept: set, additions: list[list[str]], log, where: str = "", ruled_out=None):
    """(kept with the fewest first groups of `additions` back at 16 bit with which `holds` (found by halving: about
    log2 of the groups; kept with all of them, every candidate, is known to meet), the groups left at 8 bit)."""
    def union(k: int) -> set:
        return set(kept).union(*map(set, additions[:k]))

    miss, hit = 0, len(additions)
    while hit - miss > 1:
        mid = (miss + hit) // 2
        trial = union(mid)
        why = ruled_out(trial) if ruled_out else None
        ok = False if why else holds(trial)
        log(f"  the first {mid} of {len(additions)} groups back at 16 bit ({len(trial)} tensors){where}: "
            + (why or ("meets" if ok else "misses") + " the target"))
        miss, hit = (miss, mid) if ok else (mid, hit)
    return union(hit), additions[hit:]


def _names(group: list[str]) -> str:
    return group[0] if len(group) == 1 else f"{len(group)} tensors {group[0]} .. {group[-1]}"


def _samples(c: Candidates, full: bool) -> int:
    return len(c.inputs) if full else len(c.subset)


def _done(result: dict, c: Candidates) -> dict:
    result.update(evaluations=c.evaluations, emulator_seconds=round(c.seconds, 1), emulator_remembered=c.remembered,
                  samples=len(c.subset), full_samples=len(c.inputs))
    return result

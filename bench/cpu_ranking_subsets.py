"""How the CPU ranking of tune (stages/support/cpu_ranking.py) changes on fewer tuning samples (not a test; issue 45
item 2): the ranking on every tuning sample against the ranking on k evenly spaced ones, per graph, as a table.

    cd REPO && python /path/to/bench/cpu_ranking_subsets.py MODEL VARIANT GRAPH [--k 1 2 3 4 6]

REPO: a built repo (the variant's calibration ranges and the float evaluation samples exist), e.g. the Whisper repo
of bench/whisper_tune.py. Prints, for each k: the CPU seconds, Spearman's correlation of the positions against the
full ranking, and how many of its top 32 the full ranking's top 32 shares. Nothing is written but the CPU memo.
"""
from __future__ import annotations

import argparse
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("variant")
    parser.add_argument("graph")
    parser.add_argument("--k", type=int, nargs="+", default=[1, 2, 3, 4, 6])
    args = parser.parse_args()
    import numpy as np

    from build_rules.doit_run.project import chip_params, project, rel
    from build_rules.measuring.samples import evenly_spaced
    from build_rules.stages.support import cpu_ranking
    from build_rules.stages.support.precision import Candidates
    from build_rules.tasks.tuning import _tuning_chip, _tuning_graph
    model = next(m for m in project().models if m.name == args.model)
    graph = _tuning_graph(model, model.graphs[args.graph], model.variants[args.variant])
    c = Candidates(graph, chip_params(_tuning_chip(model)), model.tuning.samples if model.tuning else 32,
                   rel(model.hooks), None)
    cpu = cpu_ranking.SwitchModel(c)
    cpu_ranking.RANKING_SECONDS = float("inf")  # every ranking on exactly the samples asked for
    everything = list(c.subset)

    def ranking(indices):
        c.subset = indices
        try:
            return cpu_ranking.order(c.candidates, cpu_ranking.costs(cpu, c.candidates))
        finally:
            c.subset = everything
    started = time.perf_counter()
    full = ranking(everything)
    rows = [(len(everything), time.perf_counter() - started, 1.0, 32)]
    position = {t: i for i, t in enumerate(full)}
    for k in args.k:
        if k >= len(everything):
            continue
        indices = [everything[i] for i in evenly_spaced(len(everything), k)]
        started = time.perf_counter()
        found = ranking(indices)
        rho = float(np.corrcoef([position[t] for t in found], np.arange(len(found)))[0, 1])
        rows.append((k, time.perf_counter() - started, rho, len(set(found[:32]) & set(full[:32]))))
    print(f"{args.model}/{args.graph}/{args.variant}: {len(c.candidates)} candidates, {len(everything)} tuning samples")
    print("| samples | CPU s | Spearman against all | top 32 shared |\n|---|---|---|---|")
    for k, seconds, rho, shared in sorted(rows):
        print(f"| {k} | {seconds:.1f} | {rho:.3f} | {shared} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

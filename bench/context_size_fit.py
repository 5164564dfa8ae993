"""Fits build_rules/measuring/context_size.py's overhead to the context binaries a repo has built, and prints a table of the
estimate against each binary's real size (Markdown; numbers go in docs/split.md).

    python bench/context_size_fit.py [repo ...]      (default: this repo's out/)

For each <variant>/<chip>/<graph>.bin it reads the model the binary was compiled from (the float .sim.onnx for fp16,
the <variant>/<graph>.qdq.onnx otherwise) and the variant's settings from model.toml, counts the constants at the
variant's bit widths (context_size.constant_bytes) and the nodes, and fits bytes = a + b * nodes + c * weights by
least squares over binaries of at least 1 MB and below it separately reported.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from build_rules.configuration import config  # noqa: E402
from build_rules.measuring import context_size  # noqa: E402


def rows(repo: Path):
    chips = config.load_chips(repo / "chips.toml")
    for model in config.load_models(repo / "models", chips):
        for variant in model.variants.values():
            for graph in model.graphs:
                source = (repo / "out" / model.name / "float" / f"{graph}.sim.onnx" if variant.is_fp16
                          else repo / "out" / model.name / variant.name / f"{graph}.qdq.onnx")
                binaries = sorted((repo / "out" / model.name / variant.name).glob(f"*/{graph}.bin"))
                if not source.is_file() or not binaries:
                    continue
                float_model = onnx.load(str(repo / "out" / model.name / "float" / f"{graph}.sim.onnx"))
                weights = sum(context_size.constant_bytes(float_model, variant.settings()).values())
                nodes = len(float_model.graph.node)
                for binary in binaries:
                    yield {"model": model.name, "graph": graph, "variant": variant.name, "chip": binary.parent.name,
                           "bytes": binary.stat().st_size, "weights": weights, "nodes": nodes}


def main(repos: list[str]) -> None:
    table = [r for repo in repos for r in rows(Path(repo))]
    a = np.array([[1.0, r["nodes"], r["weights"]] for r in table])
    y = np.array([r["bytes"] for r in table], dtype=float)
    fit, *_ = np.linalg.lstsq(a, y, rcond=None)
    print(f"fit over {len(table)} binaries: bytes = {fit[0]:.0f} + {fit[1]:.1f} * nodes + {fit[2]:.4f} * weight bytes\n")
    print("| model | graph | variant | chip | binary | weights at the variant's bits | nodes | estimate (module) | error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in table:
        estimate = context_size.OVERHEAD_BYTES + context_size.OVERHEAD_PER_NODE * r["nodes"] + \
            context_size.WEIGHT_FACTOR * r["weights"]
        print(f"| {r['model']} | {r['graph']} | {r['variant']} | {r['chip']} | {r['bytes'] / 1e6:.3f} MB | "
              f"{r['weights'] / 1e6:.3f} MB | {r['nodes']} | {estimate / 1e6:.3f} MB | "
              f"{100 * (estimate - r['bytes']) / r['bytes']:+.1f} % |")


if __name__ == "__main__":
    main(sys.argv[1:] or ["."])

"""Stage shared_context (ort-qnn, [model] share_weights): the graphs of one group (e.g. a decoder's prompt graph and
its one-token step graph) compiled into one context binary that stores the weights they share once ->
out/<model>/<variant>/<chip>/shared/<g1>+<g2>.bin, <graph>_ctx.onnx per graph (both point at it) and
<g1>+<g2>.json (sizes against the graphs compiled apart, the shared weights, each graph's I/O contract, whether the
x86 emulator loads it).

How: build_rules/toolchains/ort_qnn_shared.py (onnxruntime's ep.share_ep_contexts). The x86 HTP emulator cannot run
such a context (measured: the process crashes loading it), so the graphs are checked as compiled apart (their check
tasks) and this file's report says it was not loaded; `doit dist` ships it beside the per-graph binaries, as it does
the multi-SoC binary.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import BuildError
from ..plumbing.files import atomic_write_json


def run(params: dict) -> dict:
    import onnx

    from .. import dist
    from ..toolchains import ort_qnn, ort_qnn_shared

    group, chip = params["group"], params["chip"]
    models, names, shared_bytes = ort_qnn_shared.align_weights(
        {g: onnx.load(files["onnx"]) for g, files in params["graphs"].items()})
    if not names:
        raise BuildError(f"{params['name']}: graphs {', '.join(models)} share no weights (no initializer with the "
                         f"same value in {', '.join(f['onnx'] for f in params['graphs'].values())}); take "
                         "them out of [model] share_weights, or export them from one module so their weights match")
    folder = Path(params["outputs"]["report"]).parent
    options = {"backend_type": "htp", "soc_model": str(chip["soc_id"]), "vtcm_mb": str(chip["vtcm_mb"]),
               "htp_graph_finalization_optimization_mode": "3", "enable_htp_fp16_precision": "1" if params["fp16"] else "0"}
    try:
        made = ort_qnn_shared.compile_shared(models, folder, f"{group}.bin", options)
    except RuntimeError as e:
        raise BuildError(f"{params['name']}: {e}") from None
    binary = made["binary"]
    target = ort_qnn.read_binary_target(binary)
    if target.get("soc_type") != chip["name"]:
        raise BuildError(f"{params['name']}: {binary.name} says soc_type={target.get('soc_type')}, expected "
                         f"{chip['name']}")
    apart = {g: Path(f["apart_binary"]).stat().st_size for g, f in params["graphs"].items()}
    graphs = {}
    for graph, ctx in made["ctx_models"].items():
        contract = dist.contract_from_ctx(ctx)
        graphs[graph] = {"ctx_model": ctx.name, "qnn_graph": contract["qnn_graph"],
                         "io": {"inputs": contract["inputs"], "outputs": contract["outputs"]},
                         "apart_bytes": apart[graph]}
    emulator = ort_qnn_shared.try_on_emulator(next(iter(made["ctx_models"].values())))
    report = {"group": list(params["graphs"]), "binary": binary.name, "bytes": binary.stat().st_size,
              "apart_bytes": sum(apart.values()), "sha256": dist.sha256(binary), "target": target,
              "shared_weights": {"count": len(names), "bytes": shared_bytes, "names": names[:50]},
              "graphs": graphs, "seconds": round(made["seconds"], 3), "emulator": emulator,
              "checked": "each graph's own binary (compiled apart) on the emulator: the check tasks"}
    atomic_write_json(params["outputs"]["report"], report)
    print(f"{binary.name}: {report['bytes']} bytes for {', '.join(graphs)} ({report['apart_bytes']} compiled apart; "
          f"{len(names)} shared initializers, {shared_bytes} bytes); emulator: "
          f"{'loaded' if emulator['loaded'] else emulator['error']}", flush=True)
    return {"bytes": report["bytes"], "apart_bytes": report["apart_bytes"]}

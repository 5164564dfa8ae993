"""Which part of Whisper tiny.en carries a quantized variant's error (not a test; prints Markdown rows).

    python bench/whisper_lpbq_diag.py wer REPO ENC+DEC[,ENC+DEC...]
        greedy WER of the held-out clips on the CPU with each graph's model chosen on its own: ENC and DEC are
        variant names of REPO (their <graph>.qdq.onnx) or "float" (<graph>.sim.onnx), e.g. float+w4a16_lpbq
    python bench/whisper_lpbq_diag.py cosine REPO VARIANT[,VARIANT...]
        cosine against float of the encoder's outputs (cross K/V) per output, QDQ model on the CPU, 4 held-out clips
    python bench/whisper_lpbq_diag.py sensitivity REPO BLOCK CLIPS [all NODE...]
        weight-only: each encoder weight alone quantized as tune's per-layer search ranks it (weight_bits.fake_quantized:
        MatMul/Gemm as LPBQ in blocks of BLOCK, a Conv1d int4 per channel), everything else float; the lowest cross
        K/V cosine over CLIPS clips.
        With `all NODE...`: every weight quantized but the NODEs (a set of layers to keep at 8 bit).
REPO is a repo the whisper_tiny_en model was built in (bench/aimet_whisper.py --keep DIR makes one: DIR/repo), with
verify:whisper_tiny_en/encoder run (its out/whisper_tiny_en/float/encoder.evaluation.npz) for cosine and sensitivity.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
MODEL = "out/whisper_tiny_en"


def _graph(repo: Path, variant: str, graph: str) -> str:
    return str(repo / MODEL / ("float" if variant == "float" else variant)
               / (f"{graph}.sim.onnx" if variant == "float" else f"{graph}.qdq.onnx"))


def wer(repo: Path, mixes: list[str]) -> None:
    from build_rules.stages import evaluate
    os.chdir(repo)
    print("| encoder | decoder | WER, CPU | seconds |\n|---|---|---|---|")
    for mix in mixes:
        enc, dec = mix.split("+")
        started = time.perf_counter()
        metrics, _, _ = evaluate.measure({"hooks": "models/whisper_tiny_en/export.py", "on": "cpu",
                                         "data_dir": f"{MODEL}/data",
                                         "graphs": {"encoder": _graph(repo, enc, "encoder"),
                                                    "decoder": _graph(repo, dec, "decoder")}})
        print(f"| {enc} | {dec} | {metrics['wer']:.3f} | {time.perf_counter() - started:.0f} |", flush=True)


def _runner(repo: Path, clips: int | None = None):
    import onnxruntime as ort

    from build_rules.measuring.samples import load_evaluation
    inputs, _ = load_evaluation(str(repo / MODEL / "float/encoder.evaluation.npz"))
    inputs = inputs[:clips] if clips else inputs

    def run(model) -> list[dict]:
        session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        return [dict(zip(names, session.run(None, x))) for x in inputs]
    return run


def _cosines(out: list[dict], ref: list[dict]) -> dict[str, float]:
    import numpy as np
    found = {}
    for name in ref[0]:
        a = np.concatenate([o[name].ravel() for o in out]).astype(np.float64)
        b = np.concatenate([o[name].ravel() for o in ref]).astype(np.float64)
        found[name] = float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
    return found


def cosine(repo: Path, variants: list[str]) -> None:
    run = _runner(repo)
    ref = run(_graph(repo, "float", "encoder"))
    for variant in variants:
        found = _cosines(run(_graph(repo, variant, "encoder")), ref)
        print(f"| {variant} | {min(found.values()):.4f} | " + ", ".join(f"{k} {c:.4f}" for k, c in found.items())
              + " |", flush=True)


def sensitivity(repo: Path, block: int, clips: int, keep: list[str] | None) -> None:
    import numpy as np
    import onnx
    from onnx import numpy_helper

    from build_rules.stages.support import weight_bits
    from build_rules.toolchains import ort_qnn
    model = ort_qnn.preprocessed_model(_graph(repo, "float", "encoder"))  # the node names overrides use
    inits = {i.name: i for i in model.graph.initializer}
    run = _runner(repo, clips)
    ref = run(model.SerializeToString())

    def quantized(node) -> "np.ndarray":  # as tune's per-layer search ranks it
        return weight_bits.fake_quantized(node, numpy_helper.to_array(inits[node.input[1]]), block)

    targets = [n for n in model.graph.node
               if n.op_type in ("MatMul", "Gemm", "Conv") and len(n.input) > 1 and n.input[1] in inits]
    if keep is not None:
        for node in targets:
            if node.name not in keep:
                inits[node.input[1]].CopyFrom(numpy_helper.from_array(quantized(node), node.input[1]))
        print(f"| all but {len(keep)}: {', '.join(sorted(keep))} | "
              f"{min(_cosines(run(model.SerializeToString()), ref).values()):.5f} |", flush=True)
        return
    print(f"| node | weight | lowest cross K/V cosine, that weight alone quantized (LPBQ {block}) |\n|---|---|---|")
    for node in targets:
        old = onnx.TensorProto()
        old.CopyFrom(inits[node.input[1]])
        inits[node.input[1]].CopyFrom(numpy_helper.from_array(quantized(node), node.input[1]))
        found = min(_cosines(run(model.SerializeToString()), ref).values())
        print(f"| {node.name} | {node.op_type} {list(old.dims)} | {found:.5f} |", flush=True)
        inits[node.input[1]].CopyFrom(old)


if __name__ == "__main__":
    what, repo = sys.argv[1], Path(sys.argv[2]).resolve()
    if what == "wer":
        wer(repo, sys.argv[3].split(","))
    elif what == "cosine":
        cosine(repo, sys.argv[3].split(","))
    else:
        sensitivity(repo, int(sys.argv[3]), int(sys.argv[4]), sys.argv[6:] if sys.argv[5:6] == ["all"] else None)

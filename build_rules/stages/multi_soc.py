"""Stage 12 (ort-qnn, [dist] multi_soc = true), multi_soc: one Flexible Context Binary per graph and variant for all
the variant's chips -> out/<model>/<variant>/multi_soc/<graph>.bin + <graph>_ctx.onnx + multi_soc.json.

onnxruntime-qnn makes it when `soc_model` is a comma list (QAIRT >= 2.48, offline on x86_64): a DLC (zip) with one
HTP cache record per SoC and the weights stored once. The stage reads each record's SoC, arch and graph I/O back
from the file and tries to load it on the x86 HTP emulator; whatever fails is recorded in multi_soc.json with the
error and the stage still succeeds: the per-chip binaries are the product, this file an extra. Its bytes carry the
time it was made (dlc.metadata "timestamp"), so it is made here once, not by `dist`, whose archives must come out
byte-identical from the same files.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from ..plumbing.files import atomic_write_json


def run(params: dict) -> dict:
    folder = Path(params["outputs"]["dir"])
    folder.mkdir(parents=True, exist_ok=True)
    chips = params["chips"]
    report = {"chips": [c["name"] for c in chips], "graphs": {}}
    for graph, files in params["graphs"].items():
        try:
            report["graphs"][graph] = _make(graph, Path(files["onnx"]), Path(files["reference_ctx"]), chips,
                                            params["fp16"], folder)
        except Exception as e:  # the per-chip bundles do not depend on this file: record why, do not fail
            for name in (f"{graph}.bin", f"{graph}_ctx.onnx"):
                (folder / name).unlink(missing_ok=True)
            report["graphs"][graph] = {"error": f"{type(e).__name__}: {e}"}
            print(f"multi_soc: {graph}: {type(e).__name__}: {e}", flush=True)
    errors = [f"{g}: {r['error']}" for g, r in report["graphs"].items() if "error" in r]
    report["error"] = "; ".join(errors) or None
    atomic_write_json(params["outputs"]["report"], report)
    return {"error": report["error"]}


def _make(graph: str, model: Path, reference_ctx: Path, chips: list[dict], fp16: bool, folder: Path) -> dict:
    import onnx

    from .. import dist
    from ..toolchains import ort_qnn

    options = {"backend_type": "htp", "soc_model": ",".join(str(c["soc_id"]) for c in chips),
               "vtcm_mb": ",".join(str(c["vtcm_mb"]) for c in chips),
               "htp_graph_finalization_optimization_mode": "3", "enable_htp_fp16_precision": "1" if fp16 else "0"}
    work = Path(tempfile.mkdtemp(prefix=f".{graph}.multi-soc-", dir=folder))
    try:
        work_ctx = work / "model_ctx.onnx"
        try:
            seconds, _ = ort_qnn._compile_in_child(model, work_ctx, options)
        except ort_qnn._CompileFailed as failure:
            raise RuntimeError(f"onnxruntime-qnn could not make a multi-SoC binary of {model} for soc_model "
                               f"{options['soc_model']}: {failure}") from None
        ctx = onnx.load(str(work_ctx), load_external_data=False)
        ep_nodes = [n for n in ctx.graph.node if n.op_type == "EPContext"]
        if len(ep_nodes) != 1:
            raise RuntimeError(f"the multi-SoC EPContext model of {model} has {len(ep_nodes)} EPContext nodes")
        attrs = {a.name: a for a in ep_nodes[0].attribute}
        if attrs.get("is_multi_soc_ep_context") is None or attrs["is_multi_soc_ep_context"].i != 1:
            raise RuntimeError(f"onnxruntime-qnn made a single-SoC binary of {model} for soc_model "
                               f"{options['soc_model']} (is_multi_soc_ep_context is not 1)")
        binary, ctx_path = folder / f"{graph}.bin", folder / f"{graph}_ctx.onnx"
        os.replace(work / attrs["ep_cache_context"].s.decode(), binary)
        attrs["ep_cache_context"].s = binary.name.encode()
        ctx_path.write_bytes(ctx.SerializeToString())
    finally:
        shutil.rmtree(work, ignore_errors=True)

    contract = dist.contract_from_ctx(ctx_path)
    reference = dist.contract_from_ctx(reference_ctx)
    if [contract["inputs"], contract["outputs"]] != [reference["inputs"], reference["outputs"]]:
        raise RuntimeError(f"the multi-SoC {ctx_path.name} has another I/O contract than {reference_ctx}: "
                           f"{json.dumps(contract['inputs'] + contract['outputs'])}")
    records = dist.multi_soc_records(binary)
    found = {r["soc_model"]: r for r in records}
    for chip in chips:
        record = found.get(chip["soc_id"])
        if record is None or record["dsp_arch"] != chip["dsp_arch"]:
            raise RuntimeError(f"{binary.name} has no record for {chip['name']} (soc_model {chip['soc_id']}, "
                               f"{chip['dsp_arch']}): {[(r['record'], r['soc_model'], r['dsp_arch']) for r in records]}")
        difference = dist.compare_record_io(record["graphs"].get(contract["qnn_graph"], {}), contract)
        if difference:
            raise RuntimeError(f"{binary.name} record {record['record']} ({chip['name']}): {difference}")
    emulator = _load_on_emulator(ctx_path)
    return {"binary": binary.name, "ctx_model": ctx_path.name, "bytes": binary.stat().st_size,
            "sha256": dist.sha256(binary), "seconds": round(seconds, 3), "qnn_graph": contract["qnn_graph"],
            "soc_model": options["soc_model"],
            "records": [{k: r[k] for k in ("record", "soc_model", "dsp_arch", "soc_type", "bytes")} for r in records],
            "emulator": emulator}


def _load_on_emulator(ctx_path: Path) -> dict:
    """QNN 2.51's x86 emulator selects no record of a multi-SoC binary (measured: "Compatible cache not found",
    QNN_CONTEXT_ERROR_CREATE_FROM_BINARY); try anyway, so a newer onnxruntime-qnn that can is noticed."""
    from ..toolchains import ort_qnn
    try:
        ort_qnn.open_context_binary(ctx_path)
    except Exception as e:  # onnxruntime raises its own exception types
        return {"loaded": False, "error": " ".join(str(e).split())[:300]}
    return {"loaded": True, "error": None}

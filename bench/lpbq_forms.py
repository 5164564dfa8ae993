"""What onnxruntime-qnn does with LPBQ forms on the x86 HTP emulator (docs/block_quantization.md, "Findings").

  python bench/lpbq_forms.py model <out/m/w4a16/g.qdq.onnx> <out/m/float/g.sim.onnx> <hooks.py> 16,32,64
      rewrites an int4 per-channel QDQ model into each form -- (a) "dq": int-scale DQ -> blockwise int4 DQ,
      (a') "ql": the QuantizeLinear form, (b) "bq": a blockwise DQ with float scales, with and without
      enable_block_quant_weight_optimization -- first as it is (Gemm) and then with its Gemms as MatMul + Add, compiles
      each for SM8750 and prints binary bytes, the weights' QNN encodings, CPU nodes and cosine against float.
  python bench/lpbq_forms.py sweep K N BLOCK M
      one MatMul [1, M, K] x [K, N] in form (a): compiles and runs it (in a child process: the emulator can crash).
  python bench/lpbq_forms.py projection DECODER_ONNX WEIGHT ROUNDS
      Whisper's logits projection alone: MatMul [1, 1, 384] x WEIGHT (the float decoder's token table [384, 51864])
      compiled for SM8750 as fp16, int8 per-channel, int4 per-channel and LPBQ 64 (uint16 activations); ROUNDS
      profiled runs of each, taking turns; prints the HTP cycles (median, min-max) and binary bytes.
  python bench/lpbq_forms.py conv IC OC KERNEL BLOCK [RANK]
      one Conv (RANK 4: Conv2d on [1, IC, 16, 16]; 3: Conv1d on [1, IC, 64]) with IC input channels blocked by BLOCK,
      in forms (a), (b) and (b) with the option, the block scales shared over the kernel positions ("k") or, for
      (b), one per output channel and block ("1": [OC, IC/BLOCK, 1, 1], the shape the EP's BW_FLOAT_BLOCK path
      reads); compiles each for SM8750, prints its weights' QNN encodings, CPU nodes, binary bytes and cosine.
Experiment code, not the build's (build_rules/quantization/block_quant.py is): SKIP=<node,...> leaves nodes per-channel.
"""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np, onnx
from onnx import helper, numpy_helper, TensorProto
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from build_rules.emulator import emulator_runs
from build_rules.toolchains import ort_qnn

def lpbq_params(w, block, axis_k, scale_bits=4, bits=4):
    """w: float weight, blocks along axis_k (input channels). Returns int scales [.., nblocks ..], per-channel float, q."""
    wk = np.moveaxis(w, axis_k, 0)  # [K, ...rest]
    K = wk.shape[0]
    blocks = wk.reshape(K // block, block, *wk.shape[1:])
    absmax = np.abs(blocks).max(axis=1)  # [nb, rest]
    qmax = 2 ** (bits - 1) - 1
    s = np.maximum(absmax / qmax, 1e-12)
    top = int(__import__("os").environ.get("TOP", 2 ** scale_bits))
    pc = s.max(axis=0) / top  # [rest]
    iscale = np.clip(np.round(s / pc), 1, top).astype(np.uint8)
    eff = iscale * pc  # [nb, rest]
    q = np.clip(np.round(blocks / eff[:, None]), -qmax - 1, qmax).astype(np.int8)
    q = np.moveaxis(q.reshape(wk.shape), 0, axis_k)
    eff_s = np.moveaxis(eff, 0, axis_k)  # block scale tensor, blocks on axis_k
    isc = np.moveaxis(iscale, 0, axis_k)
    return isc, pc.astype(np.float32), q, eff_s.astype(np.float32)

def rewrite(qdq_path, float_path, out_path, form, block):
    m = onnx.load(qdq_path)
    fm = onnx.load(float_path)
    finit = {i.name: numpy_helper.to_array(i) for i in fm.graph.initializer}
    inits = {i.name: i for i in m.graph.initializer}
    consumers = {}
    for n in m.graph.node:
        for i in n.input: consumers.setdefault(i, []).append(n)
    new_nodes, blocked, skipped = [], [], []
    for n in list(m.graph.node):
        if n.op_type != "DequantizeLinear" or n.input[0] not in inits: continue
        users = consumers.get(n.output[0], [])
        if not users or any(u.op_type not in ("MatMul", "Gemm") or u.input[1] != n.output[0] for u in users): continue
        u = users[0]
        base = n.input[0].removesuffix("_quantized")
        w = finit.get(base)
        if w is None or w.ndim != 2: skipped.append((u.name, "no float")); continue
        transB = any(a.name == "transB" and a.i for a in u.attribute)
        axis_k = 1 if transB else 0
        K = w.shape[axis_k]
        import os
        if u.name in os.environ.get('SKIP', '').split(','): skipped.append((u.name, 'skip')); continue
        if K % block or K < block: skipped.append((u.name, f"K={K}")); continue
        isc, pc, q, eff = lpbq_params(w, block, axis_k)
        axis_n = 1 - axis_k
        for name in n.input: m.graph.initializer.remove(inits[name])
        wn = base + "_lpbq"
        zp = np.zeros(eff.shape, np.int8)
        if form == "bq":  # plain blockwise DQ, float block scales
            m.graph.initializer.extend([
                helper.make_tensor(wn + "_q", TensorProto.INT4, q.shape, q.flatten().tolist()),
                numpy_helper.from_array(eff, wn + "_scale"),
                helper.make_tensor(wn + "_zp", TensorProto.INT4, zp.shape, zp.flatten().tolist())])
            n.ClearField("input"); n.input.extend([wn + "_q", wn + "_scale", wn + "_zp"])
            n.ClearField("attribute"); n.attribute.extend([helper.make_attribute("axis", axis_k), helper.make_attribute("block_size", block)])
        else:
            # DQL over per-block int scales (uint8) with per-channel float scales along axis_n
            m.graph.initializer.extend([
                numpy_helper.from_array(isc, wn + "_iscale"),
                numpy_helper.from_array(pc, wn + "_pcscale"),
                numpy_helper.from_array(np.zeros(pc.shape, np.uint8), wn + "_pczp"),
                helper.make_tensor(wn + "_zp", TensorProto.INT4, zp.shape, zp.flatten().tolist())])
            sdq = helper.make_node("DequantizeLinear", [wn + "_iscale", wn + "_pcscale", wn + "_pczp"], [wn + "_bscale"],
                                   name=wn + "_scale_dql", axis=axis_n)
            new_nodes.append((n, [sdq]))
            if form == "ql":
                m.graph.initializer.append(numpy_helper.from_array(w.astype(np.float32), wn + "_float"))
                ql = helper.make_node("QuantizeLinear", [wn + "_float", wn + "_bscale", wn + "_zp"], [wn + "_ql"],
                                      name=wn + "_ql", axis=axis_k, block_size=block)
                new_nodes[-1][1].append(ql)
                n.ClearField("input"); n.input.extend([wn + "_ql", wn + "_bscale", wn + "_zp"])
            else:  # "dq": int4 weight stored
                m.graph.initializer.append(helper.make_tensor(wn + "_q", TensorProto.INT4, q.shape, q.flatten().tolist()))
                n.ClearField("input"); n.input.extend([wn + "_q", wn + "_bscale", wn + "_zp"])
            n.ClearField("attribute"); n.attribute.extend([helper.make_attribute("axis", axis_k), helper.make_attribute("block_size", block)])
        n.domain = ""  # ONNX's DequantizeLinear (opset 21) has block_size; com.microsoft's has not
        blocked.append(u.name)
    for dq, before in new_nodes:
        idx = list(m.graph.node).index(dq)
        for k, b in enumerate(before): m.graph.node.insert(idx + k, b)
    onnx.checker.check_model(m)
    onnx.save(m, out_path)
    return blocked, skipped

def compile_and_dump(model, work, soc, extra):
    work = Path(work); shutil.rmtree(work, ignore_errors=True); work.mkdir(parents=True)
    opts = {"backend_type": "htp", "soc_model": str(soc), "vtcm_mb": "8", "htp_graph_finalization_optimization_mode": "3",
            "enable_htp_fp16_precision": "0", "enable_framework_op_trace": "1", "framework_op_trace_dir": str(work / "trace"),
            "dump_json_qnn_graph": "1", "json_qnn_graph_dir": str(work / "qnn_graph"), **extra}
    try:
        secs, err = ort_qnn._compile_in_child(Path(model), work / "m_ctx.onnx", opts, verbose=True)
    except Exception as e:
        return {"error": str(e)[:300], "log": [l for l in getattr(e, "stderr", "").splitlines() if "LPBQ" in l or "BQ" in l or "block" in l.lower()][:10]}
    bins = list(work.glob("*.bin"))
    trace = json.loads((work / "trace/qnn_op_trace.json").read_text()) if (work / "trace/qnn_op_trace.json").exists() else {}
    dumpf = [p for p in (work / "qnn_graph").glob("*.json") if not p.name.endswith("_tensor_log.json")]
    dump = json.loads(dumpf[0].read_text()) if dumpf else {}
    encs = {}
    for tn, t in dump.get("graph", {}).get("tensors", {}).items():
        qp = t.get("quant_params", {})
        e = qp.get("encoding")
        if t.get("type") == 4 or qp:  # static
            encs.setdefault((e, t.get("data_type")), []).append(tn)
    ctx = onnx.load(str(work / "m_ctx.onnx"), load_external_data=False)
    cpu_nodes = [n.op_type for n in ctx.graph.node if n.op_type != "EPContext"]
    lp = [l for l in err.splitlines() if "LPBQ" in l or "BQ " in l or "BLOCKWISE" in l or "block" in l.lower()][:8]
    return {"bin_bytes": bins[0].stat().st_size if bins else None, "ctx": str(work / "m_ctx.onnx"),
            "unsupported": trace.get("unsupported_nodes"), "cpu_nodes_in_ctx": cpu_nodes,
            "encodings": {f"enc={k[0]} dtype={hex(k[1]) if k[1] else k[1]}": len(v) for k, v in encs.items()},
            "lpbq_log": lp, "dump": str(dumpf[0]) if dumpf else None}

def cosine(a, b):
    a, b = np.concatenate([x.ravel() for x in a]).astype(np.float64), np.concatenate([x.ravel() for x in b]).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))

def run_ctx(ctx, feeds):
    outs = emulator_runs.run_outputs(Path(ctx), feeds)
    return [np.concatenate([v.ravel() for v in o.values()]) for o in outs]

def gemm_to_matmul(path, out_path, names=None):
    """Gemm(A, DQ(W), DQ(b)) -> Q -> ... becomes MatMul(A, DQ(W)) -> Q/DQ (the Gemm output's scale) -> Add(DQ(b16))."""
    m = onnx.load(path)
    inits = {i.name: i for i in m.graph.initializer}
    producers = {o: n for n in m.graph.node for o in n.output}
    consumers = {}
    for n in m.graph.node:
        for i in n.input: consumers.setdefault(i, []).append(n)
    nodes = list(m.graph.node)
    out = []
    for n in nodes:
        if n.op_type != "Gemm" or (names and n.name not in names):
            out.append(n); continue
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        if attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0:
            out.append(n); continue
        q = consumers[n.output[0]][0]
        assert q.op_type == "QuantizeLinear"
        mm_out = n.output[0] + "_mm"
        B = n.input[1]
        if attrs.get("transB", 0):
            raise SystemExit("transB")
        mm = helper.make_node("MatMul", [n.input[0], B], [mm_out], name=n.name + "_matmul")
        qn = helper.make_node("QuantizeLinear", [mm_out, q.input[1], q.input[2]], [mm_out + "_q"], name=mm_out + "_QuantizeLinear")
        dqn = helper.make_node("DequantizeLinear", [mm_out + "_q", q.input[1], q.input[2]], [mm_out + "_dq"], name=mm_out + "_DequantizeLinear")
        out += [mm, qn, dqn]
        if len(n.input) > 2 and n.input[2]:
            bdq = producers[n.input[2]]
            bq = numpy_helper.to_array(inits[bdq.input[0]]).astype(np.float64)
            bs = numpy_helper.to_array(inits[bdq.input[1]]).astype(np.float64)
            bz = numpy_helper.to_array(inits[bdq.input[2]]).astype(np.float64) if len(bdq.input) > 2 else 0
            b = ((bq - bz) * bs).astype(np.float32)
            lo, hi = min(float(b.min()), 0.0), max(float(b.max()), 0.0)
            sc = np.float32((hi - lo) / 65535 or 1e-8); zp = np.uint16(round(-lo / sc))
            qb = np.clip(np.round(b / sc) + int(zp), 0, 65535).astype(np.uint16)
            bn = n.name + "_bias16"
            m.graph.initializer.extend([numpy_helper.from_array(qb, bn + "_q"), numpy_helper.from_array(np.array(sc, np.float32), bn + "_s"), numpy_helper.from_array(np.array(zp, np.uint16), bn + "_z")])
            out.append(helper.make_node("DequantizeLinear", [bn + "_q", bn + "_s", bn + "_z"], [bn], name=bn + "_DequantizeLinear"))
            out.append(helper.make_node("Add", [mm_out + "_dq", bn], [n.output[0]], name=n.name + "_bias"))
        else:
            out.append(helper.make_node("Identity", [mm_out + "_dq"], [n.output[0]]))
    m.graph.ClearField("node"); m.graph.node.extend(out)
    # drop unused initializers/nodes (old bias DQ)
    used = {i for n in m.graph.node for i in n.input}
    keep = [n for n in m.graph.node if n.op_type != "DequantizeLinear" or any(o in used for o in n.output) or any(o in {x.name for x in m.graph.output} for o in n.output)]
    m.graph.ClearField("node"); m.graph.node.extend(keep)
    used = {i for n in m.graph.node for i in n.input}
    for i in list(m.graph.initializer):
        if i.name not in used: m.graph.initializer.remove(i)
    onnx.checker.check_model(m)
    onnx.save(m, out_path)


def _feeds_and_reference(float_model, hooks_file):
    import runpy
    import onnxruntime as ort
    samples = runpy.run_path(hooks_file)["evaluation_inputs"]("block")
    session = ort.InferenceSession(str(float_model))
    return samples, [np.concatenate([v.ravel() for v in session.run(None, s)]) for s in samples]


def _measure(tag, model, samples, reference, extra=None):
    _measure_in(Path("/tmp/lpbq_forms"), tag, model, samples, reference, extra)


def _model(qdq, float_model, hooks_file, blocks):
    samples, reference = _feeds_and_reference(float_model, hooks_file)
    matmul = "/tmp/lpbq_forms/matmul.onnx"
    Path("/tmp/lpbq_forms").mkdir(exist_ok=True)
    gemm_to_matmul(str(qdq), matmul)
    _measure("per_channel", qdq, samples, reference)
    _measure("per_channel_matmul", matmul, samples, reference)
    for source, prefix in ((str(qdq), "gemm"), (matmul, "matmul")):
        for block in blocks:
            for form in ("dq", "ql", "bq"):
                out = f"/tmp/lpbq_forms/{prefix}_{form}{block}.onnx"
                print(form, block, "blocked/skipped:", rewrite(source, str(float_model), out, form, block))
                _measure(f"{prefix}_{form}{block}", out, samples, reference)
                if form == "bq":
                    _measure(f"{prefix}_{form}{block}_option", out, samples, reference,
                             {"enable_block_quant_weight_optimization": "1"})


def _sweep(k, n, block, m):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, n])],
                              [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    d = Path(f"/tmp/lpbq_forms/sweep_{k}_{n}_{block}_{m}")
    d.mkdir(parents=True, exist_ok=True)
    onnx.save(model, d / "f.onnx")
    calibration = [{"x": rng.standard_normal((1, m, k)).astype(np.float32)} for _ in range(4)]
    ort_qnn.quantize(d / "f.onnx", d / "q.onnx", calibration, activations="uint16", weights="int4", per_channel=True)
    print(rewrite(str(d / "q.onnx"), str(d / "f.onnx"), str(d / "l.onnx"), "dq", block))
    r = compile_and_dump(d / "l.onnx", d / "c", 69, {})
    print("compiled", r.get("bin_bytes"), r.get("error"), r.get("encodings"), flush=True)
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import lpbq_forms as b, numpy as np; "
            f"b.run_ctx({r['ctx']!r}, [{{'x': np.ones((1, {m}, {k}), np.float32)}}])")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    print("run exit code", run.returncode)


def _profile_cycles(ctx, feed):
    """HTP cycles of one run of a compiled EPContext model (QNN's detailed profile)."""
    import csv
    import tempfile
    with tempfile.TemporaryDirectory(prefix="lpbq-profile-") as tmp:
        ort = ort_qnn._ort()
        options = ort_qnn._qnn_session_options(ort, {"backend_type": "htp", "profiling_level": "detailed",
                                                     "profiling_file_path": f"{tmp}/p.csv"})
        session = ort.InferenceSession(str(ctx), sess_options=options)
        session.run(None, feed)
        del session
        rows = list(csv.reader(open(f"{tmp}/p.csv")))[1:]
    return next(int(r[2]) for r in rows if r[6] == "Accelerator (execute) time (cycles)")


def _projection(decoder_onnx, weight, rounds):
    import statistics
    float_decoder = onnx.load(decoder_onnx)
    w = next(numpy_helper.to_array(i) for i in float_decoder.graph.initializer if i.name == weight)
    k, n = w.shape
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="logits")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, n])],
                              [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    d = Path("/tmp/lpbq_forms/projection")
    d.mkdir(parents=True, exist_ok=True)
    onnx.save(model, d / "f.onnx")
    rng = np.random.default_rng(0)
    calibration = [{"x": rng.standard_normal((1, 1, k)).astype(np.float32)} for _ in range(4)]
    ort_qnn.quantize(d / "f.onnx", d / "int8.onnx", calibration, activations="uint16", weights="int8", per_channel=True)
    ort_qnn.quantize(d / "f.onnx", d / "int4.onnx", calibration, activations="uint16", weights="int4", per_channel=True)
    rewrite(str(d / "int4.onnx"), str(d / "f.onnx"), str(d / "lpbq64.onnx"), "dq", 64)
    ctxs, sizes = {}, {}
    for name in ("fp16", "int8", "int4", "lpbq64"):
        source = d / ("f.onnx" if name == "fp16" else f"{name}.onnx")
        result = ort_qnn.compile_context_binary(source, d / name, "p", soc_model=69, vtcm_mb=8, fp16=name == "fp16")
        ctxs[name], sizes[name] = result["ctx_model"], Path(result["binary"]).stat().st_size
        print(name, sizes[name], result.get("weight_encodings"), flush=True)
    feed = calibration[0]
    counted = {name: [] for name in ctxs}
    for _ in range(rounds):
        for name, ctx in ctxs.items():
            counted[name].append(_profile_cycles(ctx, feed))
    print(f"load average at the end {__import__('os').getloadavg()}")
    print("| weights | binary bytes | HTP cycles per run, median (min-max) |\n|---|---|---|")
    for name, xs in counted.items():
        cycles = f"{statistics.median(xs) / 1e6:.1f} M ({min(xs) / 1e6:.1f}-{max(xs) / 1e6:.1f})"
        print(f"| {name} | {sizes[name]:,} | {cycles} |")


def _conv_model(ic, oc, kernel, rank, rng):
    spatial = [16, 16] if rank == 4 else [64]
    fan_in = ic * kernel ** (rank - 2)
    w = (rng.standard_normal((oc, ic, *[kernel] * (rank - 2))) / np.sqrt(fan_in)).astype(np.float32)
    w[:, : ic // 4] *= 8  # an outlier quarter of the input channels: what blocks are for
    b = (rng.standard_normal(oc) * 0.1).astype(np.float32)
    pads = [kernel // 2] * (2 * (rank - 2))
    graph = helper.make_graph([helper.make_node("Conv", ["x", "W", "B"], ["y"], name="conv", pads=pads)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, ic, *spatial])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, oc, *spatial])],
                              [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model, w, [{"x": rng.standard_normal((1, ic, *spatial)).astype(np.float32)} for _ in range(8)]


def conv_rewrite(qdq_path, w, out_path, form, block, scale_shape):
    """The Conv's per-channel int4 weight DequantizeLinear of a QDQ model as form (a) ("dq") or (b) ("bq"), blocks
    along the input channels (axis 1), scales per (output channel, block): shared over the kernel positions
    (scale_shape "k": [OC, IC/B, kh, kw], what ONNX's blocked DequantizeLinear requires) or "1" ([OC, IC/B, 1, 1])."""
    m = onnx.load(qdq_path)
    inits = {i.name: i for i in m.graph.initializer}
    conv = next(n for n in m.graph.node if n.op_type == "Conv")
    dq = next(n for n in m.graph.node if n.output[0] == conv.input[1])
    oc, ic = w.shape[:2]
    nb = ic // block
    blocks = w.reshape(oc, nb, block, *w.shape[2:])
    absmax = np.abs(blocks).reshape(oc, nb, -1).max(axis=2)  # [OC, nb]: one scale per output channel and block
    s = np.maximum(absmax / 7, 1e-12)
    pc = s.max(axis=1) / 16
    iscale = np.clip(np.round(s / pc[:, None]), 1, 16)
    eff = (iscale * pc[:, None]).astype(np.float32)
    q = np.clip(np.round(blocks / eff.reshape(oc, nb, 1, *[1] * (w.ndim - 2))), -8, 7).astype(np.int8).reshape(w.shape)
    shape = (oc, nb, *w.shape[2:]) if scale_shape == "k" else (oc, nb, *[1] * (w.ndim - 2))
    expand = lambda a: np.ascontiguousarray(np.broadcast_to(a.reshape(oc, nb, *[1] * (w.ndim - 2)), shape))
    for name in dq.input:
        m.graph.initializer.remove(inits[name])
    base = "W_lpbq"
    zp = np.zeros(shape, np.int8)
    m.graph.initializer.extend([helper.make_tensor(base + "_q", TensorProto.INT4, q.shape, q.flatten().tolist()),
                                helper.make_tensor(base + "_zp", TensorProto.INT4, shape, zp.flatten().tolist())])
    if form == "bq":
        m.graph.initializer.append(numpy_helper.from_array(expand(eff), base + "_scale"))
        before = []
    else:
        m.graph.initializer.extend([numpy_helper.from_array(expand(iscale).astype(np.uint8), base + "_iscale"),
                                    numpy_helper.from_array(pc.astype(np.float32), base + "_pcscale"),
                                    numpy_helper.from_array(np.zeros(oc, np.uint8), base + "_pczp")])
        before = [helper.make_node("DequantizeLinear", [base + "_iscale", base + "_pcscale", base + "_pczp"],
                                   [base + "_scale"], name=base + "_scale_dql", axis=0)]
    dq.ClearField("input")
    dq.input.extend([base + "_q", base + "_scale", base + "_zp"])
    dq.ClearField("attribute")
    dq.attribute.extend([helper.make_attribute("axis", 1), helper.make_attribute("block_size", block)])
    dq.domain = ""
    index = list(m.graph.node).index(dq)
    for k, node in enumerate(before):
        m.graph.node.insert(index + k, node)
    onnx.save(m, out_path)


def _conv(ic, oc, kernel, block, rank=4):
    rng = np.random.default_rng(0)
    model, w, samples = _conv_model(ic, oc, kernel, rank, rng)
    d = Path(f"/tmp/lpbq_forms/conv_{ic}_{oc}_{kernel}_{block}_{rank}")
    d.mkdir(parents=True, exist_ok=True)
    onnx.save(model, d / "f.onnx")
    ort_qnn.quantize(d / "f.onnx", d / "q.onnx", samples, activations="uint16", weights="int4", per_channel=True)
    ort_qnn.quantize(d / "f.onnx", d / "q8.onnx", samples, activations="uint16", weights="int8", per_channel=True)
    import onnxruntime as ort
    reference = [np.concatenate([v.ravel() for v in ort.InferenceSession(str(d / "f.onnx")).run(None, s)])
                 for s in samples]
    _measure_in(d, "int8_per_channel", d / "q8.onnx", samples, reference)
    _measure_in(d, "int4_per_channel", d / "q.onnx", samples, reference)
    for form, scale_shape in (("dq", "k"), ("bq", "k"), ("bq", "1")):
        out = d / f"{form}_{scale_shape}.onnx"
        conv_rewrite(str(d / "q.onnx"), w, str(out), form, block, scale_shape)
        _measure_in(d, f"{form}_{scale_shape}", out, samples, reference)
        if form == "bq":
            _measure_in(d, f"{form}_{scale_shape}_option", out, samples, reference,
                        {"enable_block_quant_weight_optimization": "1"})


def _measure_in(d, tag, model, samples, reference, extra=None):
    """_measure for one probe folder: compile, encodings, CPU nodes, emulator and CPU cosine (a model the CPU EP
    refuses gets its error instead)."""
    import onnxruntime as ort
    r = compile_and_dump(model, d / tag, 69, extra or {})
    if "ctx" in r:
        import pickle
        import tempfile
        code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import lpbq_forms as b, pickle; "
                f"print('COS', b.cosine(b.run_ctx({r['ctx']!r}, pickle.load(open(sys.argv[1], 'rb'))), "
                "pickle.load(open(sys.argv[2], 'rb'))))")
        with tempfile.TemporaryDirectory() as tmp:
            pickle.dump(samples, open(f"{tmp}/s", "wb"))
            pickle.dump(reference, open(f"{tmp}/r", "wb"))
            run = subprocess.run([sys.executable, "-c", code, f"{tmp}/s", f"{tmp}/r"], capture_output=True, text=True)
        found = [line for line in run.stdout.splitlines() if line.startswith("COS")]
        r["cosine"] = float(found[0].split()[1]) if found else f"emulator died (exit {run.returncode})"
    try:
        cpu = ort.InferenceSession(str(model))
        r["cpu_cosine"] = cosine([np.concatenate([v.ravel() for v in cpu.run(None, s)]) for s in samples], reference)
    except Exception as e:  # an ONNX form the CPU EP does not take
        r["cpu_cosine"] = f"CPU EP: {str(e)[:160]}"
    r.pop("ctx", None)
    r.pop("dump", None)
    r["unsupported"] = [(u["node_name"], u["reason"][:90]) for u in r.get("unsupported") or []
                        if "graph input" not in u["reason"] and "graph output" not in u["reason"]]
    print(tag, json.dumps(r), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "model":
        _model(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4], [int(b) for b in sys.argv[5].split(",")])
    elif sys.argv[1] == "projection":
        _projection(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif sys.argv[1] == "conv":
        _conv(*(int(a) for a in sys.argv[2:]))
    else:
        _sweep(*(int(a) for a in sys.argv[2:6]))

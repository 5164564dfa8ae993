"""onnxruntime-qnn: several graphs compiled into one QNN context that stores the weights they share once.

onnxruntime's session options `ep.share_ep_contexts` (every session of the group) and `ep.stop_share_ep_contexts`
(the last one) make the QNN EP keep one QNN backend and context across the group's compiles in one process; the last
compile writes one .bin holding every graph, and each graph's _ctx.onnx points at it (microsoft/onnxruntime#23702,
#23945; x86_64 offline only). Measured here (onnxruntime-qnn 2.7.0, QNN 2.51):
- the graphs' activation tensors and nodes must have names no other graph of the group uses: the second compile of
  two graphs that both read an `x` fails with "Failed to pre-register input: x_QuantizeLinear_Output ... 7003"
  ("Failed to compose Qnn graph"). So every name but the initializers' gets the graph's name as a prefix before
  compiling, and the _ctx.onnx models get their I/O names back afterwards (the EP hands EPContext I/O to the binary
  by position);
- weights are shared by initializer name (align_weights gives equal values one name first): two graphs with one 256 x 256 MatMul weight gave 196,608 bytes
  (fp16) against 2 x 176,128 compiled apart, and 151,552 against 2 x 114,688 for w16a8 QDQ models;
- the bytes are the same on every compile of the same models (a fresh process per group, as for single graphs);
- the x86 HTP emulator does not run it: loading either _ctx.onnx crashed the process (SIGSEGV) with QNN 2.51, where
  an earlier measurement got QNN_COMMON_ERROR_NOT_SUPPORTED. Checks therefore run the graphs compiled apart.
Imported only inside stages (onnx, onnxruntime are heavy).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

_MARK = "ORT_QNN_SHARED_JSON "


def prefix_for(graph: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", graph) + "__"


def _content(initializer) -> tuple:
    import hashlib
    from onnx import numpy_helper
    array = numpy_helper.to_array(initializer)
    return (initializer.data_type, tuple(initializer.dims), hashlib.sha256(array.tobytes()).hexdigest())


def align_weights(models: dict) -> tuple[dict, list[str], int]:
    """The group's models with every initializer whose value the first model has under that model's name (the
    shared context shares weights by name: exporters and onnxsim may name the same folded weight differently in
    two graphs), and (names, bytes) of the weights every model has. models: graph -> ModelProto (copies made)."""
    import onnx
    first = next(iter(models.values()))
    canonical = {}
    for initializer in first.graph.initializer:
        canonical.setdefault(_content(initializer), initializer.name)
    aligned, common = {}, None
    for graph, model in models.items():
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        renames, kept, names = {}, [], set()
        for initializer in copy.graph.initializer:
            target = canonical.get(_content(initializer), initializer.name)
            if target in names:  # a second constant of this value in the graph: read the first one instead
                renames[initializer.name] = target
                continue
            renames[initializer.name] = target
            initializer.name = target
            names.add(target)
            kept.append(initializer)
        del copy.graph.initializer[:]
        copy.graph.initializer.extend(kept)
        for node in copy.graph.node:
            node.input[:] = [renames.get(n, n) for n in node.input]
        aligned[graph] = copy
        common = names if common is None else common & names
    sizes = {i.name: i.ByteSize() for i in first.graph.initializer}
    shared = sorted(n for n in (common or ()) if n in sizes)
    return aligned, shared, sum(sizes[n] for n in shared)


def _prefixed(model, prefix: str):
    """The model with every tensor name but its initializers' (and every node name) prefixed."""
    import onnx
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    keep = {i.name for i in copy.graph.initializer}

    def name(n: str) -> str:
        return n if not n or n in keep else prefix + n
    for node in copy.graph.node:
        node.input[:] = [name(n) for n in node.input]
        node.output[:] = [name(n) for n in node.output]
        node.name = prefix + node.name
    for value in [*copy.graph.input, *copy.graph.output, *copy.graph.value_info]:
        if value.name not in keep:
            value.name = prefix + value.name
    return copy


def _restore_io_names(ctx_path: Path, prefix: str) -> None:
    """Give the _ctx.onnx model its graph's own I/O names back; inside the binary they keep the prefix, so the
    EPContext node keeps its names too (an input or output it takes or gives directly is passed through an Identity,
    which ONNX Runtime runs on the CPU)."""
    import onnx
    from onnx import helper
    model = onnx.load(str(ctx_path), load_external_data=False)
    ep = next(n for n in model.graph.node if n.op_type == "EPContext")
    renamed = {v.name: v.name[len(prefix):] for v in [*model.graph.input, *model.graph.output]
               if v.name.startswith(prefix)}
    bridges = []
    for value in [*model.graph.input, *model.graph.output]:
        value.name = renamed.get(value.name, value.name)
    for node in model.graph.node:
        if node is ep:
            continue
        node.input[:] = [renamed.get(n, n) for n in node.input]
        node.output[:] = [renamed.get(n, n) for n in node.output]
    for inner, outer in renamed.items():
        if inner in ep.input:
            bridges.insert(0, helper.make_node("Identity", [outer], [inner], name=f"{inner}__io"))
        elif inner in ep.output:
            bridges.append(helper.make_node("Identity", [inner], [outer], name=f"{inner}__io"))
    nodes = [n for n in model.graph.node]
    del model.graph.node[:]
    model.graph.node.extend([b for b in bridges if b.output[0] in ep.input] + nodes
                            + [b for b in bridges if b.input[0] in ep.output])
    ctx_path.write_bytes(model.SerializeToString())


def compile_shared(models: dict, out_dir: Path, binary_name: str, provider_options: dict) -> dict:
    """Compile the group's models (graph -> ModelProto from align_weights, in order) into out_dir/<binary_name> and
    one out_dir/<graph>_ctx.onnx per graph pointing at it. Returns {"seconds", "ctx_models": {graph: path}, "binary"}."""
    import onnx
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".shared-", dir=out_dir) as tmp:
        work = Path(tmp)
        request = []
        for graph, model in models.items():
            prefixed = work / f"{prefix_for(graph)}input.onnx"
            onnx.save(_prefixed(model, prefix_for(graph)), str(prefixed))
            request.append({"graph": graph, "model": str(prefixed), "ctx": str(work / f"{graph}_ctx.onnx")})
        ort_qnn = Path(__file__).with_name("ort_qnn.py").resolve()
        code = ("import importlib.util as u, sys; s = u.spec_from_file_location('_ort_qnn_shared', sys.argv[1]); "
                "m = u.module_from_spec(s); s.loader.exec_module(m); m._child(sys.argv[2])")
        proc = subprocess.run([sys.executable, "-c", code, str(Path(__file__).resolve()), str(ort_qnn)],
                              input=json.dumps({"models": request, "options": provider_options}), capture_output=True,
                              text=True)
        reply = next((json.loads(line[len(_MARK):]) for line in proc.stdout.splitlines() if line.startswith(_MARK)),
                     None)
        if reply is None or "error" in reply:
            detail = reply["error"] if reply else f"exit code {proc.returncode}: {(proc.stderr or '').strip()[-2000:]}"
            raise RuntimeError(f"onnxruntime-qnn could not compile {', '.join(models)} into one context: {detail}")
        first_ctx = onnx.load(request[0]["ctx"], load_external_data=False)
        made = _ep_attribute(first_ctx, "ep_cache_context")
        binary = out_dir / binary_name
        (work / made).replace(binary)
        ctx_models = {}
        for entry in request:
            ctx = onnx.load(entry["ctx"], load_external_data=False)
            if _ep_attribute(ctx, "ep_cache_context") != made:
                raise RuntimeError(f"{entry['graph']}_ctx.onnx points at {_ep_attribute(ctx, 'ep_cache_context')}, "
                                   f"not the group's {made}: the EP did not share the context")
            for node in ctx.graph.node:
                for a in node.attribute:
                    if node.op_type == "EPContext" and a.name == "ep_cache_context":
                        a.s = binary.name.encode()
            target = out_dir / f"{entry['graph']}_ctx.onnx"
            target.write_bytes(ctx.SerializeToString())
            _restore_io_names(target, prefix_for(entry["graph"]))
            ctx_models[entry["graph"]] = target
    return {"seconds": reply["seconds"], "ctx_models": ctx_models, "binary": binary}


def _ep_attribute(model, name: str) -> str:
    for node in model.graph.node:
        if node.op_type == "EPContext":
            for a in node.attribute:
                if a.name == name:
                    return a.s.decode()
    raise RuntimeError(f"no EPContext node with {name}")


def _child(ort_qnn_path: str) -> None:
    """The compile process: one QNN backend shared by the group's sessions, in order."""
    import importlib.util
    import time
    spec = importlib.util.spec_from_file_location("_ort_qnn_for_shared", ort_qnn_path)
    ort_qnn = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ort_qnn)
    request = json.loads(sys.stdin.read())
    try:
        ort = ort_qnn._ort()
        started = time.perf_counter()
        for number, entry in enumerate(request["models"]):
            so = ort_qnn._qnn_session_options(ort, request["options"])
            so.add_session_config_entry("ep.share_ep_contexts", "1")
            if number == len(request["models"]) - 1:
                so.add_session_config_entry("ep.stop_share_ep_contexts", "1")
            compiler = ort.ModelCompiler(so, Path(entry["model"]).read_bytes(), embed_compiled_data_into_model=False,
                                         flags=ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED)
            compiler.compile_to_file(entry["ctx"])
        reply = {"seconds": time.perf_counter() - started}
    except Exception as e:  # reported to the parent
        reply = {"error": f"{type(e).__name__}: {e}"}
    sys.stdout.write("\n" + _MARK + json.dumps(reply) + "\n")
    sys.stdout.flush()


def try_on_emulator(ctx_model: Path) -> dict:
    """Load a graph of the shared context on the x86 HTP emulator in a process of its own (QNN 2.51 crashed)."""
    code = ("import sys; sys.path.insert(0, sys.argv[2]); from build_rules.toolchains import ort_qnn; "
            "ort_qnn.open_context_binary(sys.argv[1]); print('LOADED')")
    package_parent = str(Path(__file__).resolve().parents[2])
    proc = subprocess.run([sys.executable, "-c", code, str(ctx_model), package_parent], capture_output=True,
                          text=True)
    if proc.returncode == 0 and "LOADED" in proc.stdout:
        return {"loaded": True, "error": None}
    if proc.returncode < 0:
        return {"loaded": False, "error": f"the emulator process died with signal {-proc.returncode} while loading it"}
    lines = [line for line in (proc.stderr or "").splitlines() if line.strip()]
    return {"loaded": False, "error": " ".join((lines[-1] if lines else f"exit code {proc.returncode}").split())[:300]}

"""Stage 2, simplify + check: onnxsim -> <graph>.sim.onnx, plus an I/O summary and op inventory.

QNN HTP runs static graphs only and has no int64: every graph input and output must have fixed
dims and a supported dtype, otherwise the build stops here naming the tensor.
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from ..errors import BuildError
from ..plumbing.files import atomic_write_json
from ..plumbing.lean_imports import onnxsim_simplify
from ..plumbing.native_stderr import captured
from ..measuring.shape_break import shape_break


# Element types a graph input or output may have on QNN HTP (int64 has its own message: export it as int32).
IO_DTYPES = ("float32", "float16", "int32", "uint32", "int16", "uint16", "int8", "uint8", "bool")


UNFOLDED = re.compile(r'^WARNING: failed to run "([^"]+)" op \(name is "([^"]*)"\), skip\.\.\. ?(.*)$')


def said_once(lines: list[str]) -> None:
    """What onnxsim wrote to stderr, each line once. Its per-node `WARNING: failed to run "Concat" op (name is ...),
    skip... no initializer ...` lines (a node whose inputs it could not compute ahead: the node stays in the graph,
    nothing is wrong) become one line naming each node once, with the first one's reason."""
    unfolded: dict[str, tuple[str, str]] = {}
    others: list[str] = []
    for line in lines:
        found = UNFOLDED.match(line.strip())
        if found:
            unfolded.setdefault(found.group(2), (found.group(1), found.group(3)))
        elif line.strip() and line not in others:
            others.append(line)
    for line in others:
        print(line, flush=True)
    if unfolded:
        names = list(unfolded)
        op, why = unfolded[names[0]]
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        print(f"onnxsim kept {len(names)} node(s) it could not fold ahead of time (they run as they are): {shown} "
              f"(the first: {op} {names[0]}: {why or 'no reason given'})", flush=True)


def _tensor_info(value) -> dict:
    t = value.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]
    return {"name": value.name, "shape": dims, "dtype": _dtype_name(t.elem_type)}


def _dtype_name(elem_type: int) -> str:
    """numpy's name for a numeric ONNX element type (float32, int64), else ONNX's own (string, bfloat16)."""
    import onnx
    try:
        name = onnx.helper.tensor_dtype_to_np_dtype(elem_type).name
    except (KeyError, TypeError, ValueError):
        name = "object"
    if name != "object" and not name.startswith("void"):
        return name
    if elem_type in onnx.TensorProto.DataType.values():
        return onnx.TensorProto.DataType.Name(elem_type).lower()
    return f"element type {elem_type}"


def one_line(error: Exception) -> str:
    """An exception's message on one line (onnx's checker writes node specs over several)."""
    return " ".join(str(error).split())


def check_io_types(model, source: str) -> None:
    """Every graph input and output is a tensor of a type QNN HTP takes, or the build stops here naming it (before
    onnxsim, which would only say that a field is missing)."""
    inits = {init.name for init in model.graph.initializer}
    problems = []
    for kind, values in (("input", [v for v in model.graph.input if v.name not in inits]), ("output", model.graph.output)):
        for v in values:
            if not v.type.HasField("tensor_type"):
                problems.append(f"{kind} '{v.name}' is a {v.type.WhichOneof('value') or 'value of no type'}, not a tensor")
                continue
            dtype = _dtype_name(v.type.tensor_type.elem_type)
            if dtype not in IO_DTYPES + ("int64",):  # int64: named with its fix after simplification
                problems.append(f"{kind} '{v.name}' is {dtype} (QNN HTP graph I/O: {', '.join(IO_DTYPES)})")
    if problems:
        raise BuildError(f"{source}: " + "; ".join(problems))


def run(params: dict) -> dict:
    import numpy as np
    import onnx

    source = params["onnx"]
    try:
        model = onnx.load(source)
    except Exception as e:
        raise BuildError(f"{source}: not a valid ONNX model: {one_line(e)}") from e
    after = ""
    if params.get("hooks"):  # an ONNX-only model: the user's patch first
        from ..measuring.samples import load_hooks, transformed
        hooks = load_hooks(params["hooks"])
        if hasattr(hooks, "transform"):
            model, after = transformed(hooks, model, params["hooks"]), f" after {params['hooks']}: transform(model)"
            print(f"{source}: transformed by {params['hooks']}: transform(model)", flush=True)
    try:
        onnx.checker.check_model(model)
    except Exception as e:
        raise BuildError(f"{source}{after}: not a valid ONNX model: {one_line(e)}") from e
    check_io_types(model, source + after)
    declared = params["inputs"]  # name -> {shape, dtype}; pins dynamic dims of ONNX-file models
    graph_inputs = [i.name for i in model.graph.input
                    if i.name not in {init.name for init in model.graph.initializer}]
    unknown = [n for n in declared if n not in graph_inputs]
    if unknown:
        raise BuildError(f"{source}: declared input(s) {', '.join(unknown)} not in the model "
                         f"(its inputs: {', '.join(graph_inputs)})")
    contradiction = declared_against_model(model, declared, source, params["where"])
    if contradiction:  # onnxsim would fail later with a misleading message (a dynamic output shape)
        raise BuildError(contradiction)
    model = _opset_for_quantization(model, source)
    constants = constants_to_initializers(model)
    said: list[str] = []  # onnxsim's C++ warnings: printed once each, its unfolded nodes on one line
    try:
        with captured() as said:
            simplified, ok = onnxsim_simplify()(
                model, overwrite_input_shapes={n: s["shape"] for n, s in declared.items()} or None)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__  # the rest: its C++ stack
        broken = shape_break(model, declared, params["where"]) if declared else ""
        if broken:
            raise BuildError(f"{source}: {broken}") from e
        raise BuildError(f"{source}: onnxsim failed: {first}{_control_flow(model)}") from e
    finally:
        said_once(said)
    if not ok:
        raise BuildError(f"{source}: onnxsim could not validate the simplified model")
    constants += constants_to_initializers(simplified)
    folded = fold_constants(simplified)
    if constants or folded:
        print(f"{constants} Constant node(s) made initializers, {folded} node(s) of constants folded", flush=True)
    flow = _control_flow(simplified)
    if flow:  # onnxsim folds an If whose condition is constant; one left over would fail every compile
        raise BuildError(f"{source}: {flow.removeprefix('; ')}")
    inferred = infer_output_shapes(simplified)
    if inferred:
        print(f"{inferred} output shape(s) inferred from the inputs' shapes", flush=True)
    moved = reduce_before_unsqueeze(simplified)
    if moved:
        print(f"{moved} reduction(s) moved before the Unsqueeze that fed them", flush=True)
    copied = unshare_biases(simplified)  # after onnxsim, which merges equal initializers into one
    if copied:
        print(f"{copied} shared bias initializer(s) copied, one per node that reads them", flush=True)
    # onnxsim writes metadata_props that crash onnxruntime's qnn_preprocess_model.
    del simplified.metadata_props[:]

    inputs = [_tensor_info(v) for v in simplified.graph.input
              if v.name not in {init.name for init in simplified.graph.initializer}]
    outputs = [_tensor_info(v) for v in simplified.graph.output]
    problems = []
    for kind, tensors in (("input", inputs), ("output", outputs)):
        for t in tensors:
            if not t["shape"] or not all(isinstance(d, int) and d > 0 for d in t["shape"]):
                problems.append(f"{kind} '{t['name']}' has a dynamic shape {t['shape']}")
            if t["dtype"] == "int64":
                problems.append(f"{kind} '{t['name']}' is int64 (QNN HTP has no int64: use int32)")
    if problems and declared and all(not p.startswith("input") for p in problems):
        # static inputs, yet an output is not: a node the declared shapes break (a stride that does not divide them)
        broken = shape_break(model, declared, params["where"])
        if broken:
            raise BuildError(f"{source}: {broken}")
    if problems:
        raise BuildError(f"{source}: " + "; ".join(problems) + f" -- {_io_fix(params['where'], inputs)}")
    expected_outputs = params["output_names"]
    if expected_outputs and [o["name"] for o in outputs] != expected_outputs:
        raise BuildError(f"{source}: outputs are {[o['name'] for o in outputs]}, model.toml says {expected_outputs}")
    if params.get("step"):
        check_state_shapes(source, params["where"], params["step"], inputs, outputs)

    out = Path(params["outputs"]["onnx"])
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(simplified, str(out))
    ops = Counter(node.op_type for node in simplified.graph.node)
    atomic_write_json(params["outputs"]["io"], {
        "inputs": inputs, "outputs": outputs, "opset": max(o.version for o in simplified.opset_import),
        "ops": dict(sorted(ops.items())), "nodes": len(simplified.graph.node),
        "parameters": int(sum(int(np.prod(i.dims)) for i in simplified.graph.initializer)),
    })
    return {"nodes": len(simplified.graph.node)}


def declared_against_model(model, declared: dict, source: str, where: str) -> str:
    """'' or the message naming each declared input dim that contradicts a fixed dim of the model's input (a rank
    that differs, or a fixed size that differs), with the shape to declare."""
    found = []
    for value in model.graph.input:
        if value.name not in declared:
            continue
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or "?")
                for d in value.type.tensor_type.shape.dim]
        want = list(declared[value.name]["shape"])
        if not dims:
            continue  # no shape in the model: the declaration is all there is
        shown = "[" + ", ".join(str(d) for d in dims) + "]"
        if len(dims) != len(want):
            found.append(f"input '{value.name}' is declared with {len(want)} dims {want}, but the model's has "
                         f"{len(dims)}: {shown}")
            continue
        clashes = [i for i, (d, w) in enumerate(zip(dims, want)) if isinstance(d, int) and d != w]
        if clashes:
            fixed = [w if i not in clashes else dims[i] for i, w in enumerate(want)]
            found.append(f"input '{value.name}' is declared {want}, but the model fixes "
                         + ", ".join(f"dim {i} at {dims[i]} (declared {want[i]})" for i in clashes)
                         + f" (its shape: {shown}): declare {fixed}")
    if not found:
        return ""
    return f"{where} inputs: " + "; ".join(found) + f" -- the model is {source}; only its dynamic dims can be pinned"


def check_state_shapes(source: str, where: str, step: dict, inputs: list[dict], outputs: list[dict]) -> None:
    """Each state output must fit the input it feeds: the same shape and dtype (a recurrent state), or with a cache
    the input's shape with one position along the cache axis (the slice the caller writes at the offset)."""
    shapes = {t["name"]: t for t in inputs + outputs}
    cache = step.get("cache")
    for output, target in step["state"].items():
        out, into = shapes[output], shapes[target]
        want = list(into["shape"])
        if cache:
            want[cache["axis"]] = 1
        if list(out["shape"]) != want or out["dtype"] != into["dtype"]:
            what = (f"one position of it along the cache axis {cache['axis']}" if cache else "the same shape")
            raise BuildError(f"{source}: state output '{output}' is {out['dtype']}{list(out['shape'])} but feeds input "
                             f"'{target}' {into['dtype']}{list(into['shape'])}, which needs {what}: "
                             f"{into['dtype']}{want} ({where} state)")


CONTROL_FLOW = ("If", "Loop", "Scan")


def _control_flow(model) -> str:
    """'; ...' naming the graph's control-flow nodes and the fix, or '' when it has none."""
    nodes = [f"'{n.name or n.output[0]}' ({n.op_type})" for n in model.graph.node if n.op_type in CONTROL_FLOW]
    if not nodes:
        return ""
    return (f"; the graph has control flow, which QNN HTP cannot run: {', '.join(nodes[:5])}"
            + (f" and {len(nodes) - 5} more" if len(nodes) > 5 else "")
            + " -- fix: export the branch the device needs as its own graph (an If whose condition comes from a "
              "fixed input shape or a constant is folded here; one that tests an input value is not)")


def _io_fix(where: str, inputs: list[dict]) -> str:
    """The fix for dynamic or int64 graph I/O, with the model.toml line that pins the inputs."""
    def dims(shape):
        return ", ".join(str(d) if isinstance(d, int) and d > 0 else ("1" if i == 0 else "<n>")
                         for i, d in enumerate(shape))
    entries = ", ".join(f'{t["name"]} = {{ shape = [{dims(t["shape"])}], dtype = '
                        f'"{"int32" if t["dtype"] == "int64" else t["dtype"]}" }}' for t in inputs)
    return (f"fix the export (static shapes, int32), or pin the inputs in {where}: inputs = {{ {entries} }} "
            "(outputs follow from the inputs)")


def _static(value) -> bool:
    dims = value.type.tensor_type.shape.dim
    return bool(dims) and all(d.HasField("dim_value") and d.dim_value > 0 for d in dims)


def infer_output_shapes(model) -> int:
    """Graph outputs whose declared shape is dynamic (exporters write -1 or a name there, and onnxsim leaves the
    declaration as it was after pinning the inputs) get the shape ONNX infers from the inputs, when static."""
    from onnx import shape_inference

    dynamic = [o for o in model.graph.output if not _static(o)]
    if not dynamic:
        return 0
    probe = type(model)()
    probe.CopyFrom(model)
    del probe.graph.value_info[:]  # stale intermediate shapes (-1 dims) would flow into the outputs again
    for o in probe.graph.output:
        if not _static(o):
            o.type.tensor_type.ClearField("shape")
    try:
        inferred = {o.name: o for o in shape_inference.infer_shapes(probe).graph.output}
    except Exception:
        return 0  # the check below names the outputs that stay dynamic
    count = 0
    for o in dynamic:
        if o.name in inferred and _static(inferred[o.name]):
            o.type.tensor_type.shape.CopyFrom(inferred[o.name].type.tensor_type.shape)
            count += 1
    return count


def constants_to_initializers(model) -> int:
    """Constant nodes of the main graph become initializers of the same name. Exporters of other frameworks
    (Paddle's p2o.helper.constant.*, TF) keep them as nodes; the quantizer then treats them as activations, quantized
    at run time, which QNN refuses (a Pad value: "dynamic constant_value"; a weight: "Failed to create tensor ...
    7004") and which costs a weight its per-channel scale. Returns how many."""
    import onnx
    from onnx import numpy_helper
    kept, made = [], 0
    for node in model.graph.node:
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.attribute) != 1:
            kept.append(node)
            continue
        attribute = node.attribute[0]
        value = onnx.helper.get_attribute_value(attribute)
        if attribute.name == "value":
            tensor = value
        elif attribute.name in ("value_float", "value_floats", "value_int", "value_ints"):
            import numpy as np
            dtype = np.float32 if attribute.name.startswith("value_float") else np.int64
            tensor = numpy_helper.from_array(np.array(value, dtype=dtype))
        else:  # sparse or string constants: leave them to onnxruntime
            kept.append(node)
            continue
        tensor.name = node.output[0]
        model.graph.initializer.append(tensor)
        made += 1
    if made:
        del model.graph.node[:]
        model.graph.node.extend(kept)
    return made


# Ops whose result is the same on every run, so a node with only initializer inputs can be computed once here.
_NOT_FOLDABLE = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
                 "If", "Loop", "Scan", "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}


def fold_constants(model) -> int:
    """Nodes whose inputs are all initializers, computed once (onnx's reference evaluator) into initializers.
    onnxsim leaves some (e.g. when an input was a Constant node, or above its size limit). Q/DQ stay: they are
    the quantization itself. Returns how many nodes were folded."""
    from onnx import numpy_helper
    folded = 0
    while True:
        known = {i.name for i in model.graph.initializer}
        node = next((n for n in model.graph.node if n.op_type not in _NOT_FOLDABLE and n.domain in ("", "ai.onnx")
                     and n.input and all(not i or i in known for i in n.input) and n.output), None)
        if node is None:
            return folded
        initializers = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer if i.name in node.input}
        try:
            values = _evaluate(node, initializers, model)
        except Exception:  # an op the reference evaluator lacks: leave it to onnxruntime
            return folded
        for name, value in zip(node.output, values):
            model.graph.initializer.append(numpy_helper.from_array(value, name))
        model.graph.node.remove(node)
        folded += 1


def _evaluate(node, initializers: dict, model) -> list:
    import onnx
    from onnx.reference import ReferenceEvaluator
    inputs = [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for n, v in initializers.items()]
    outputs = [onnx.helper.make_empty_tensor_value_info(o) for o in node.output]
    graph = onnx.helper.make_graph([node], "fold", inputs, outputs)
    single = onnx.helper.make_model(graph, opset_imports=model.opset_import)
    return ReferenceEvaluator(single).run(None, initializers)


# Ops whose input 2 onnxruntime's QDQ quantizer quantizes as a bias (int32, scale = input scale x weight scale).
BIAS_OPS = ("Conv", "ConvTranspose", "Gemm", "InstanceNormalization", "LayerNormalization")


def unshare_biases(model) -> int:
    """A float initializer read as the bias of several nodes gets a copy per node. Why: a bias's scale comes from its
    node's input and weight scales, so onnxruntime's quantizer copies a shared bias and names the copy <bias><n>,
    unique among initializers only. tf2onnx's exports (and onnxsim, which merges equal initializers) share biases,
    and when <bias><n> is already a node's output, the QDQ model reads the bias where that activation was (seen
    on a TF audio model: "Invalid attribute perm {0, 2, 3, 1}, input shape = {36}" at a Transpose). The copies
    here get names no tensor of the graph has, so the quantizer never copies. Returns how many biases were copied."""
    from onnx import TensorProto
    floats = {i.name: i for i in model.graph.initializer if i.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16)}
    readers: dict[str, list] = {}
    for node in model.graph.node:
        if node.op_type in BIAS_OPS and node.domain in ("", "ai.onnx") and len(node.input) > 2 \
                and node.input[2] in floats:
            readers.setdefault(node.input[2], []).append(node)
    shared = {bias: nodes for bias, nodes in readers.items() if len(nodes) > 1}
    if not shared:
        return 0
    taken = _tensor_names(model.graph)
    for bias, nodes in shared.items():
        for node in nodes[1:]:  # the first reader keeps the original
            name, n = f"{bias}_{node.name or node.output[0]}", 1
            while name in taken:
                n += 1
                name = f"{bias}_{node.name or node.output[0]}_{n}"
            taken.add(name)
            copy = type(floats[bias])()
            copy.CopyFrom(floats[bias])
            copy.name = name
            model.graph.initializer.append(copy)
            node.input[2] = name
    return len(shared)


def _tensor_names(graph) -> set[str]:
    """Every tensor name of a graph and its subgraphs."""
    names = {i.name for i in graph.initializer} | {v.name for v in (*graph.input, *graph.output, *graph.value_info)}
    for node in graph.node:
        names.update(node.input)
        names.update(node.output)
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                names |= _tensor_names(sub)
    return names


REDUCTIONS = ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2")


def reduce_before_unsqueeze(model) -> int:
    """Unsqueeze -> Reduce* over the new axes too (keepdims) becomes Reduce* over the original axes -> Unsqueeze:
    the same values (the new axes have size 1). Why: the dynamo exporter writes AdaptiveAvgPool1d(1) as
    Unsqueeze -> ReduceMean(axes [-1, -2]) on rank 4, and after a Conv1d QNN HTP computes that wrongly with 16-bit
    activations (measured on the emulator: cosine 0.53 against float; 1.0 at 8 bit, and 1.0 for the rank-3
    ReduceMean this gives). Returns how many were rewritten."""
    import numpy as np
    import onnx
    from onnx import numpy_helper
    initializers = {i.name: i for i in model.graph.initializer}
    consumers: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers[name] = consumers.get(name, 0) + 1
    outputs = {o.name for o in model.graph.output}
    producer = {o: n for n in model.graph.node for o in n.output}
    moved = 0
    for reduce in list(model.graph.node):
        unsqueeze = producer.get(reduce.input[0]) if reduce.input else None
        if (reduce.op_type not in REDUCTIONS or unsqueeze is None or unsqueeze.op_type != "Unsqueeze"
                or consumers.get(unsqueeze.output[0]) != 1 or unsqueeze.output[0] in outputs
                or len(unsqueeze.input) != 2 or unsqueeze.input[1] not in initializers
                or len(reduce.input) != 2 or reduce.input[1] not in initializers
                or any(a.name == "keepdims" and a.i == 0 for a in reduce.attribute)):
            continue  # only the opset >= 18 form (axes as inputs), keepdims, one reader
        added = [int(a) for a in numpy_helper.to_array(initializers[unsqueeze.input[1]]).ravel()]
        axes = [int(a) for a in numpy_helper.to_array(initializers[reduce.input[1]]).ravel()]
        rank = len(added) + _rank(model, unsqueeze.input[0])
        if rank <= len(added):
            continue  # the input's rank is unknown
        added = sorted(a % rank for a in added)
        axes = sorted(a % rank for a in axes)
        if not set(added) <= set(axes):
            continue
        kept = [i for i in range(rank) if i not in added]  # positions of the original axes in the new tensor
        original = [kept.index(a) for a in axes if a not in added]
        if not original:
            continue
        name = f"{reduce.name or reduce.output[0]}_before_unsqueeze"
        model.graph.initializer.append(numpy_helper.from_array(np.array(original, np.int64), f"{name}_axes"))
        reduced = f"{name}_output"
        position = list(model.graph.node).index(unsqueeze)
        model.graph.node.remove(unsqueeze)
        model.graph.node.insert(position, onnx.helper.make_node(reduce.op_type, [unsqueeze.input[0], f"{name}_axes"],
                                                                [reduced], name=name, keepdims=1))
        reduce_at = list(model.graph.node).index(reduce)
        model.graph.node.remove(reduce)
        model.graph.node.insert(reduce_at, onnx.helper.make_node("Unsqueeze", [reduced, unsqueeze.input[1]],
                                                                 [reduce.output[0]], name=f"{name}_unsqueeze"))
        moved += 1
    return moved


def _rank(model, tensor: str) -> int:
    import onnx
    inferred = onnx.shape_inference.infer_shapes(model)
    for value in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        if value.name == tensor and value.type.tensor_type.HasField("shape"):
            return len(value.type.tensor_type.shape.dim)
    return 0


# Per-channel DequantizeLinear (axis) needs opset 13: older exports are converted before quantization.
QUANTIZATION_OPSET = 13


def _opset_for_quantization(model, source: str):
    import onnx
    from onnx import version_converter
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or opset >= QUANTIZATION_OPSET:
        return model
    print(f"{source}: converting opset {opset} -> {QUANTIZATION_OPSET} (per-channel quantization needs it)", flush=True)
    try:
        converted = version_converter.convert_version(model, QUANTIZATION_OPSET)
        # IR < 4 lists initializers among the graph inputs; initializers made later need IR >= 4 (7 goes with opset 13).
        converted.ir_version = max(converted.ir_version, 7)
        onnx.checker.check_model(converted)
        return converted
    except Exception as e:
        raise BuildError(f"{source}: opset {opset} is older than {QUANTIZATION_OPSET}, which quantized HTP models "
                         f"need (per-channel DequantizeLinear), and onnx's version converter failed: {one_line(e)}; re-export "
                         f"the model with opset >= {QUANTIZATION_OPSET}") from e

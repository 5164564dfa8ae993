"""Stage split: cut a graph too big for one context into sequential parts, each compiled into its own context binary.

Two kinds of task, one module:
  split:<model>/<graph>            the plan (<graph>.split.json: where to cut, what crosses each cut, each part's
                                   estimated size per variant, the line that pins it) and the float parts
                                   <graph>.part<k>.sim.onnx (what fp16 variants compile), from <graph>.sim.onnx
  split:<model>/<graph>/<variant>  the same cuts applied to the variant's whole-graph QDQ model ->
                                   <variant>/<graph>.part<k>.qdq.onnx

Where to cut: the float graph's nodes in their order (the exporter's, which follows forward()); a cut between two
nodes is crossed by the tensors made before it and read after it (graph inputs do not cross: every part reads the
ones it needs from the app). Candidate cuts are those crossed by the fewest tensors (one activation, between two
blocks of a CNN or at a transformer's residual stream); among them the plan picks the N-1 that balance the parts'
weight bytes best (ties: fewer bytes crossing, then the earlier cut), so the same graph and settings always give the
same plan. `cuts = [[...]]` pins a plan: the cut is made where exactly those tensors cross.

Why the QDQ parts are cut from the whole graph's QDQ model instead of quantizing each part: calibration and
quantization run once on the whole graph, so a tensor crossing a cut has one scale/offset, the same on both sides.
Part k ends with that tensor's QuantizeLinear -> DequantizeLinear (the binary's output is the fixed-point value) and
part k+1 starts with the same pair (its binary's input is that fixed-point value): the app passes the buffer on as
it is, and chaining the parts computes what the whole QDQ graph computes.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from ..measuring import context_size
from ..errors import BuildError
from ..plumbing.files import atomic_write_json

PIN_HINT = "pin this plan: copy `pin` into [graphs.{graph}] of model.toml"


# --- the plan ----------------------------------------------------------------------------------------------

class _Graph:
    """The float graph's node order, who makes and reads each tensor, and each node's first-use weight bytes."""

    def __init__(self, model):
        self.model = model
        self.nodes = list(model.graph.node)
        self.initializers = {i.name: i for i in model.graph.initializer}
        self.inputs = [i.name for i in model.graph.input if i.name not in self.initializers]
        self.outputs = [o.name for o in model.graph.output]
        self.producer = {}
        self.last_use = {}
        for index, node in enumerate(self.nodes):
            for name in node.output:
                if name:
                    self.producer[name] = index
            for name in node.input:
                if name and name not in self.initializers:
                    self.last_use[name] = index
        # Each node's share of the weights (at 16 bit: proportions are what matters): a constant counts where it
        # is first read in each role, as context_size counts it (a tied embedding is stored as table and as weight).
        seen, self.weights = set(), []
        for node in self.nodes:
            fresh = []
            for index, name in enumerate(node.input):
                if name in self.initializers:
                    role = context_size.role(node.op_type, index)
                    if (name, role) not in seen and (role != "bias" or (name, "weight") not in seen):
                        seen.add((name, role))
                        fresh.append(name)
            self.weights.append(sum(_values(self.initializers[n]) * 2.0 for n in fresh))
        self.prefix = [0.0]
        for w in self.weights:
            self.prefix.append(self.prefix[-1] + w)
        self.shapes = _value_shapes(model)

    def crossing(self, position: int) -> list[str]:
        """Tensors made before node `position` and read at or after it, in the order they are made."""
        found = []
        for name, made in self.producer.items():
            if made < position <= self.last_use.get(name, -1):
                found.append(name)
        return sorted(found, key=lambda n: (self.producer[n], n))

    def tensor_bytes(self, name: str) -> int:
        shape, dtype = self.shapes.get(name, (None, None))
        if not shape or any(not isinstance(d, int) for d in shape):
            return 0
        return int(math.prod(shape)) * (dtype.itemsize if dtype is not None else 4)


def _values(tensor) -> int:
    return int(math.prod(tensor.dims)) if tensor.dims else 1


def _value_shapes(model) -> dict:
    import onnx
    from onnx import helper
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {}
    for value in [*inferred.graph.input, *inferred.graph.output, *inferred.graph.value_info]:
        t = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        try:
            dtype = helper.tensor_dtype_to_np_dtype(t.elem_type)
        except Exception:
            dtype = None
        shapes[value.name] = (dims, dtype)
    return shapes


def _candidates(g: _Graph, allowed: set[str] | None) -> dict[int, list[str]]:
    """position -> crossing tensors, for the cuts crossed by the fewest tensors (that survive quantization's
    preprocessing, `allowed`) with weights on both sides."""
    total = g.prefix[-1]
    by_count: dict[int, dict[int, list[str]]] = {}
    for position in range(1, len(g.nodes)):
        if not 0 < g.prefix[position] < total:
            continue
        tensors = g.crossing(position)
        if not tensors or (allowed is not None and not set(tensors) <= allowed) or set(tensors) & set(g.outputs):
            continue  # a graph output crossing a cut would need two names: not a place to cut
        by_count.setdefault(len(tensors), {})[position] = tensors
    return by_count


def _best_cuts(g: _Graph, positions: dict[int, list[str]], parts: int) -> list[int] | None:
    """The parts-1 positions that minimise (largest part's weight bytes, bytes crossing, positions)."""
    points = sorted(positions)
    if len(points) < parts - 1:
        return None
    crossing = {p: sum(g.tensor_bytes(t) for t in positions[p]) for p in points}
    n = len(g.nodes)
    ends = points + [n]
    # best[k][j]: the best way to cut nodes [0, ends[j]) into k+1 parts, the last one ending at ends[j]
    best = [[None] * len(ends) for _ in range(parts)]
    for j, end in enumerate(ends):
        best[0][j] = (g.prefix[end], 0, ())
    for k in range(1, parts):
        for j, end in enumerate(ends):
            choice = None
            for i in range(j):
                previous = best[k - 1][i]
                if previous is None or i >= len(points):
                    continue
                start = ends[i]
                cost = (max(previous[0], g.prefix[end] - g.prefix[start]), previous[1] + crossing[start],
                        previous[2] + (start,))
                if choice is None or cost < choice:
                    choice = cost
            best[k][j] = choice
    final = best[parts - 1][len(ends) - 1]
    return list(final[2]) if final is not None else None


def _pinned_cuts(g: _Graph, cuts: list[list[str]], where: str) -> list[int]:
    positions = []
    start = 1
    for number, wanted in enumerate(cuts, 1):
        unknown = [t for t in wanted if t not in g.producer]
        if unknown:
            raise BuildError(f"{where}: cut {number} names {', '.join(map(repr, unknown))}, which no node of the "
                             "graph makes (names as in out/<model>/float/<graph>.split.json)")
        found = next((p for p in range(start, len(g.nodes)) if set(g.crossing(p)) == set(wanted)), None)
        if found is None:
            raise BuildError(f"{where}: cut {number}: no place after cut {number - 1} where exactly "
                             f"{sorted(wanted)} cross (every tensor made before the cut and read after it must be "
                             "listed); drop `cuts` to let the build choose, or copy the plan's `pin` line again")
        positions.append(found)
        start = found + 1
    return positions


def plan(model, graph: str, split: dict, variants: dict[str, dict], allowed: set[str] | None, where: str) -> dict:
    g = _Graph(model)
    if split.get("cuts"):
        positions = _pinned_cuts(g, split["cuts"], where)
        return _describe(g, graph, positions, variants, "pinned")
    by_count = _candidates(g, allowed)
    if not by_count:
        raise BuildError(f"{where}: found no place to cut: no point between two nodes has weights on both sides "
                         "and tensors the quantizer keeps crossing it")

    def cuts_for(parts: int) -> list[int] | None:
        pool: dict[int, list[str]] = {}
        for count in sorted(by_count):  # the fewest crossing tensors first; more only if too few places
            pool.update(by_count[count])
            if len(pool) >= parts - 1:
                return _best_cuts(g, pool, parts)
        return None

    if split.get("parts"):
        positions = cuts_for(split["parts"])
        if positions is None:
            raise BuildError(f"{where}: cannot cut into {split['parts']} parts: only "
                             f"{sum(len(v) for v in by_count.values())} places to cut")
        return _describe(g, graph, positions, variants, f"parts = {split['parts']}")
    limit = split["max_part_mb"] * 1e6
    for parts in range(2, sum(len(v) for v in by_count.values()) + 2):
        positions = cuts_for(parts)
        if positions is None:
            break
        described = _describe(g, graph, positions, variants, f"max_part_mb = {split['max_part_mb']:g}")
        if max(p["largest_estimate"] for p in described["parts"]) <= limit:
            return described
    raise BuildError(f"{where}: no plan keeps every part within max_part_mb = {split['max_part_mb']:g}: a single "
                     "node's weights may be larger (lower-bit weights, or a larger max_part_mb)")


def _describe(g: _Graph, graph: str, positions: list[int], variants: dict[str, dict], how: str) -> dict:
    bounds = [0, *positions, len(g.nodes)]
    parts, cuts = [], []
    for k in range(len(bounds) - 1):
        nodes = g.nodes[bounds[k]:bounds[k + 1]]
        estimates = {v: context_size.estimate(g.model, settings, nodes)["bytes"] for v, settings in variants.items()}
        parts.append({"name": f"{graph}.part{k + 1}", "first_node": nodes[0].name, "last_node": nodes[-1].name,
                      "nodes": len(nodes), "node_range": [bounds[k], bounds[k + 1]], "estimates": estimates,
                      "largest_estimate": max(estimates.values(), default=0)})
    for position in positions:
        tensors = g.crossing(position)
        cuts.append({"after_node": g.nodes[position - 1].name,
                     "tensors": [{"name": t, "shape": g.shapes.get(t, (None, None))[0],
                                  "dtype": str(g.shapes.get(t, (None, None))[1]), "bytes": g.tensor_bytes(t)}
                                 for t in tensors]})
    for k, part in enumerate(parts):
        part["inputs"], part["outputs"] = _part_io(g, bounds[k], bounds[k + 1])
    pin = "split = { cuts = [" + ", ".join("[" + ", ".join(json.dumps(t["name"]) for t in c["tensors"]) + "]"
                                          for c in cuts) + "] }"
    whole = {v: context_size.estimate(g.model, settings)["bytes"] for v, settings in variants.items()}
    return {"graph": graph, "how": how, "parts": parts, "cuts": cuts, "pin": pin, "whole_estimates": whole,
            "note": PIN_HINT.format(graph=graph)}


def _part_io(g: _Graph, start: int, end: int) -> tuple[list[str], list[str]]:
    made = set()
    read = []
    for node in g.nodes[start:end]:
        for name in node.input:
            if name and name not in g.initializers and name not in made and name not in read:
                read.append(name)
        made.update(n for n in node.output if n)
    later = set()
    for node in g.nodes[end:]:
        later.update(node.input)
    outputs = [n for node in g.nodes[start:end] for n in node.output if n and (n in later or n in g.outputs)]
    return read, outputs


# --- cutting a model into its parts -------------------------------------------------------------------------

def _submodel(model, nodes, inputs: list[str], outputs: list[str], shapes: dict, name: str):
    """A model of `nodes` alone, with these graph inputs and outputs and the initializers the nodes read."""
    import onnx
    from onnx import helper

    used = {n for node in nodes for n in node.input}
    initializers = [i for i in model.graph.initializer if i.name in used]
    known = {v.name: v for v in [*model.graph.input, *model.graph.output, *model.graph.value_info]}

    def value(tensor: str):
        if tensor in known:
            copy = onnx.ValueInfoProto()
            copy.CopyFrom(known[tensor])
            copy.name = tensor
            return copy
        dims, dtype = shapes.get(tensor, (None, None))
        if dims is None or dtype is None:
            raise BuildError(f"{name}: the shape or type of tensor {tensor!r}, which crosses a cut, is unknown")
        return helper.make_tensor_value_info(tensor, helper.np_dtype_to_tensor_dtype(dtype), dims)

    graph = helper.make_graph(list(nodes), name, [value(t) for t in inputs], [value(t) for t in outputs],
                              initializers)
    part = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version,
                             producer_name="build_rules split")
    for prop in model.metadata_props:
        part.metadata_props.add(key=prop.key, value=prop.value)
    onnx.checker.check_model(part)
    return part


def float_parts(model, described: dict) -> list:
    g_nodes = list(model.graph.node)
    shapes = _value_shapes(model)
    return [_submodel(model, g_nodes[p["node_range"][0]:p["node_range"][1]], p["inputs"], p["outputs"], shapes,
                      p["name"]) for p in described["parts"]]


def qdq_parts(qdq_model, described: dict, where: str) -> list:
    """The plan's parts of a whole-graph QDQ model. Its compute nodes keep the float graph's names (the quantizer
    adds Q/DQ nodes around them); every other node (Q/DQ, nodes the QNN preprocessing made) goes with the earliest
    part that reads its output, or with its input's part when only graph outputs read it."""
    part_of_name = {}
    for k, part in enumerate(described["parts"]):
        part_of_name.update({n: k for n in part["node_names"]})
    nodes = list(qdq_model.graph.node)
    initializers = {i.name for i in qdq_model.graph.initializer}
    producer = {o: i for i, node in enumerate(nodes) for o in node.output if o}
    # Nodes of constants only (a weight's DequantizeLinear): every part that reads one gets its own copy, so a weight
    # two parts read (a tied embedding) is not a tensor crossing a cut
    constant = set()
    for i, node in enumerate(nodes):
        if all(not n or n in initializers or (n in producer and producer[n] in constant) for n in node.input):
            constant.add(i)
    readers: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            readers.setdefault(name, []).append(i)
    part = [None if i in constant else part_of_name.get(node.name) for i, node in enumerate(nodes)]
    for i in reversed(range(len(nodes))):  # the earliest part that reads it (nodes are in topological order)
        if part[i] is None and i not in constant:
            later = [part[j] for o in nodes[i].output for j in readers.get(o, []) if part[j] is not None]
            part[i] = min(later) if later else None
    for i, node in enumerate(nodes):  # read only by graph outputs: with what makes its input
        if part[i] is None and i not in constant:
            before = [part[producer[n]] for n in node.input if n in producer and part[producer[n]] is not None]
            part[i] = max(before, default=0)
    for i, node in enumerate(nodes):
        for name in node.input:
            if i not in constant and name in producer and producer[name] not in constant \
                    and part[producer[name]] > part[i]:
                raise BuildError(f"{where}: node {node.name!r} ({node.op_type}) of part {part[i] + 1} reads "
                                 f"{name!r} from part {part[producer[name]] + 1}: the QDQ model does not follow "
                                 "the float graph's order (a pinned plan may name a tensor the quantizer fused)")

    def with_constants(chosen: set[int]) -> list[int]:
        needed, stack = set(chosen), list(chosen)
        while stack:
            for name in nodes[stack.pop()].input:
                j = producer.get(name)
                if j is not None and j in constant and j not in needed:
                    needed.add(j)
                    stack.append(j)
        return sorted(needed)

    shapes = _value_shapes(qdq_model)
    parts = []
    for k, planned in enumerate(described["parts"]):
        mine = [_copy(nodes[i]) for i in with_constants({i for i in range(len(nodes)) if part[i] == k})]
        cut_in = [t["name"] for t in described["cuts"][k - 1]["tensors"]] if k > 0 else []
        cut_out = [t["name"] for t in described["cuts"][k]["tensors"]] if k < len(described["cuts"]) else []
        for tensor in cut_out:
            mine = _end_with_qdq(mine, nodes, tensor)
        for tensor in cut_in:
            mine = _start_with_qdq(mine, nodes, tensor)
        made = {o for node in mine for o in node.output}
        outputs = cut_out + [o.name for o in qdq_model.graph.output if o.name in made and o.name not in cut_out]
        read = []
        for node in mine:
            read += [n for n in node.input if n and n not in made and n not in initializers and n not in read]
        unexpected = [n for n in read if n not in planned["inputs"]]
        if unexpected:
            raise BuildError(f"{where}: in the QDQ model, {planned['name']} reads {', '.join(map(repr, unexpected))} "
                             f"from an earlier part, which the plan does not let cross (it crosses "
                             f"{', '.join(cut_in) or 'nothing'}); a pinned plan may name a tensor the quantizer "
                             "fused away: drop `cuts` or pin the plan made for this graph again")
        parts.append(_submodel(qdq_model, mine, read, outputs, shapes, planned["name"]))
    return parts


def _copy(node):
    import onnx
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    return copy


def _quantize_pair(nodes, tensor: str):
    """The QuantizeLinear reading `tensor` in the whole QDQ model and the DequantizeLinear of its output."""
    q = next((n for n in nodes if n.op_type == "QuantizeLinear" and n.input[0] == tensor), None)
    if q is None:
        return None, None
    dq = next((n for n in nodes if n.op_type == "DequantizeLinear" and n.input[0] == q.output[0]), None)
    return q, dq


def _end_with_qdq(mine: list, nodes, tensor: str) -> list:
    """Part k's output `tensor` as its quantized value: producer -> `tensor`__float -> Q -> DQ -> `tensor`, with the
    whole model's Q/DQ parameters (a copy of its pair; the pair itself stays where its readers are)."""
    from onnx import helper
    q, dq = _quantize_pair(nodes, tensor)
    if q is None or dq is None:
        return mine  # not quantized (e.g. an int tensor): it crosses as it is
    float_name = f"{tensor}__float"
    for node in mine:
        node.output[:] = [float_name if o == tensor else o for o in node.output]
        node.input[:] = [float_name if i == tensor else i for i in node.input]
    q_out = f"{tensor}__cut_q"
    mine.append(helper.make_node("QuantizeLinear", [float_name, *q.input[1:]], [q_out], name=f"{tensor}__cut_q",
                                 **_attributes(q)))
    mine.append(helper.make_node("DequantizeLinear", [q_out, *dq.input[1:]], [tensor], name=f"{tensor}__cut_dq",
                                 **_attributes(dq)))
    return mine


def _start_with_qdq(mine: list, nodes, tensor: str):
    """Part k+1's input `tensor`: it reaches its readers through the same Q -> DQ as in the whole model."""
    from onnx import helper
    q, dq = _quantize_pair(nodes, tensor)
    if q is None or dq is None:
        return mine
    have = {n.name for n in mine}
    if q.name in have and dq.name in have:
        return mine  # the pair itself landed in this part (its readers are all here): it reads the graph input
    extra = []
    if q.name not in have:
        extra.append(helper.make_node("QuantizeLinear", list(q.input), list(q.output), name=q.name, **_attributes(q)))
    if dq.name not in have:
        extra.append(helper.make_node("DequantizeLinear", list(dq.input), list(dq.output), name=dq.name,
                                      **_attributes(dq)))
    return extra + mine


def _attributes(node) -> dict:
    from onnx import helper
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


# --- the stage ---------------------------------------------------------------------------------------------

def run(params: dict) -> dict:
    return _plan_stage(params) if params["mode"] == "plan" else _variant_stage(params)


def _allowed_tensors(sim: str, quantized: bool) -> set[str] | None:
    """Tensors that still exist after the QNN preprocessing the quantizer runs and its own activation folding
    (fusions remove some): a cut must be crossed by tensors both the float and the QDQ model have."""
    if not quantized:
        return None
    from ..toolchains import ort_qnn
    model = ort_qnn.preprocessed_model(Path(sim))
    readers: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    # onnxruntime's QDQ quantizer removes a Relu or Clip whose input nothing else reads: the node before it writes
    # the activation's output instead (QDQRemovableActivation), so that input is no tensor of the QDQ model
    folded = {n.input[0] for n in model.graph.node if n.op_type in ("Relu", "Clip") and readers.get(n.input[0]) == 1}
    return {o for node in model.graph.node for o in node.output} - folded


def _plan_stage(params: dict) -> dict:
    import onnx
    where = params["name"]
    model = onnx.load(params["onnx"])
    quantized = any(v.get("precision") != "fp16" for v in params["variants"].values())
    described = plan(model, params["graph"], params["split"], params["variants"],
                     _allowed_tensors(params["onnx"], quantized), where)
    nodes = list(model.graph.node)
    for p in described["parts"]:
        p["node_names"] = [n.name for n in nodes[p["node_range"][0]:p["node_range"][1]]]
    parts = len(described["parts"])
    _remember_parts(params, parts)
    if parts != params["parts"]:
        raise BuildError(f"{where}: the plan has {parts} parts; this build was set up for {params['parts']} "
                         f"({params['split_text']}): run doit again (the plan is remembered in "
                         f"{params['memo']}), or pin it: [graphs.{params['graph']}] {described['pin']}")
    _check_budgets(described, params, where)
    for part, made in zip(described["parts"], float_parts(model, described)):
        _save(made, params["outputs"][part["name"]])
    described["source"] = {"onnx": params["onnx"]}
    atomic_write_json(params["outputs"]["plan"], described)
    for line in _summary(described):
        print(line, flush=True)
    return {"parts": parts, "cuts": [[t["name"] for t in c["tensors"]] for c in described["cuts"]]}


def _save(model, path: str) -> None:
    import onnx
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)


def _remember_parts(params: dict, parts: int) -> None:
    """How many parts the last plan had, for the next load's task list (not a target: the loader reads it)."""
    atomic_write_json(params["memo"], {"parts": parts, "split": params["split"]})


def _check_budgets(described: dict, params: dict, where: str) -> None:
    for part in described["parts"]:
        for variant, chips in params["budgets"].items():
            estimate = part["estimates"][variant]
            for chip, (budget_mb, source) in chips.items():
                if estimate > budget_mb * 1e6:
                    more = len(described["parts"]) + 1
                    raise BuildError(
                        f"{where}: {part['name']} (part {part['name'].rsplit('part', 1)[1]} of "
                        f"{len(described['parts'])}) at variant {variant} on {chip}: estimated context binary "
                        f"{context_size.mb(estimate)}, over the budget of {budget_mb:g} MB ({source}). Fix: more parts "
                        f"([graphs.{params['graph']}] split = {{ parts = {more} }}, or split = {{ max_part_mb = "
                        f"{budget_mb:g} }}), or lower-bit weights for {variant}")


def _summary(described: dict) -> list[str]:
    lines = [f"plan ({described['how']}): {len(described['parts'])} parts"]
    for part in described["parts"]:
        sizes = ", ".join(f"{v} {context_size.mb(b)}" for v, b in part["estimates"].items())
        lines.append(f"  {part['name']}: nodes {part['first_node']} .. {part['last_node']} ({part['nodes']}); "
                     f"estimated {sizes}")
    for number, cut in enumerate(described["cuts"], 1):
        lines.append(f"  cut {number} after {cut['after_node']}: "
                     + ", ".join(f"{t['name']} {t['dtype']}{t['shape']}" for t in cut["tensors"]))
    lines.append(f"  pin: {described['pin']}")
    return lines


def _variant_stage(params: dict) -> dict:
    import onnx
    described = json.loads(Path(params["plan"]).read_text())
    model = onnx.load(params["onnx"])
    made = qdq_parts(model, described, params["name"])
    for part, sub in zip(described["parts"], made):
        _save(sub, params["outputs"][part["name"]])
    return {"parts": len(made)}

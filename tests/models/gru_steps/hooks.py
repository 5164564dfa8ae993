"""Hooks of an ONNX-only GRU model rebuilt as a step graph: one nn.GRUCell per ONNX GRU node, weights read from the
ONNX file (the model's checkpoint), the state as graph inputs and outputs. The recipe of docs/models.md, "Recurrent
layers as cells"; tests/test_recurrent_cells.py checks that rolling the cells over a sequence gives what
onnxruntime gives for the ONNX file."""
import numpy as np

FRAMES = 16  # input features per frame
# ONNX orders a GRU's gates z, r, h; PyTorch's GRUCell r, z, n: the rows of W, R and B move accordingly
ONNX_TO_TORCH_GATES = (1, 0, 2)


def gru_cells(path):
    """One torch.nn.GRUCell per GRU node of the ONNX file, in graph order, with its weights."""
    import onnx
    import torch
    from onnx import numpy_helper

    model = onnx.load(str(path))
    weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    cells = []
    for node in (n for n in model.graph.node if n.op_type == "GRU"):
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        where = f"{path}: GRU node {node.name or node.output[0]!r}"
        if attributes.get("linear_before_reset", 0) != 1:
            raise ValueError(f"{where}: linear_before_reset = 0 has no nn.GRUCell equivalent (PyTorch applies the "
                             "reset gate after the recurrent matmul); rebuild this cell by hand")
        if attributes.get("direction", b"forward") not in (b"forward", "forward"):
            raise ValueError(f"{where}: a {attributes['direction']} GRU reads the future: it has no step form")
        w, r = weights[node.input[1]][0], weights[node.input[2]][0]  # [3 * hidden, in], [3 * hidden, hidden]
        hidden = r.shape[1]
        bias = weights[node.input[3]][0] if len(node.input) > 3 and node.input[3] else np.zeros(6 * hidden, np.float32)

        def torch_order(rows):
            blocks = rows.reshape(3, hidden, *rows.shape[1:])
            return torch.from_numpy(np.ascontiguousarray(blocks[list(ONNX_TO_TORCH_GATES)].reshape(rows.shape)))

        cell = torch.nn.GRUCell(w.shape[1], hidden)
        with torch.no_grad():
            cell.weight_ih.copy_(torch_order(w))
            cell.weight_hh.copy_(torch_order(r))
            cell.bias_ih.copy_(torch_order(bias[:3 * hidden]))
            cell.bias_hh.copy_(torch_order(bias[3 * hidden:]))
        cells.append(cell)
    return cells, model, weights


def build(graph, checkpoints):
    """The step graph: the GRU cells, then the rest of the network rebuilt in torch from its initializers (here the
    head: MatMul + Add + Sigmoid after the last GRU)."""
    import torch

    cells, model, weights = gru_cells(checkpoints[0])
    matmul = next(n for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in weights)
    add = next(n for n in model.graph.node if n.op_type == "Add" and matmul.output[0] in n.input)
    bias = next(i for i in add.input if i in weights)
    head = torch.nn.Linear(*weights[matmul.input[1]].shape)
    with torch.no_grad():
        head.weight.copy_(torch.from_numpy(weights[matmul.input[1]].T.copy()))
        head.bias.copy_(torch.from_numpy(weights[bias].copy()))

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cells = torch.nn.ModuleList(cells)
            self.head = head

        def forward(self, frame, h0, h1):
            h0_out = self.cells[0](frame, h0)
            h1_out = self.cells[1](h0_out, h1)
            return torch.sigmoid(self.head(h1_out)), h0_out, h1_out

    return Step().eval()


def sequence(seed: int, length: int = 24) -> np.ndarray:
    """Frames of a smooth random signal (a stand-in for log-power spectra): [length, FRAMES]."""
    rng = np.random.default_rng(seed)
    walk = np.cumsum(rng.standard_normal((length, FRAMES)), axis=0) / 4
    return walk.astype(np.float32)


def steps(count: int, seed: int) -> list[dict]:
    """Inputs as the app feeds them: each frame with the state the cells carry after the frames before it."""
    import torch

    step = build("step", CHECKPOINTS)  # noqa: F821 (set by the stage)
    samples, h0, h1 = [], torch.zeros(1, 32), torch.zeros(1, 32)
    frames = sequence(seed, count)
    with torch.no_grad():
        for frame in frames:
            x = torch.from_numpy(frame[None])
            samples.append({"frame": x.numpy(), "h0": h0.numpy(), "h1": h1.numpy()})
            _, h0, h1 = step(x, h0, h1)
    return samples


def calibration_inputs(graph, count):
    return steps(count, seed=1)


def evaluation_inputs(graph):
    return steps(12, seed=2)

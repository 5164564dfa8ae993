"""A YOLOv8-style detector small enough for tests: one output `output0` [1, 4 + 3, 144] holding each anchor's box
(cx, cy, w, h in pixels of a 320-pixel frame) and its 3 class scores (0..1), as the Ultralytics export does. Seeded weights;
write_model() writes the ONNX file (an ONNX-only model, as users bring YOLO exports).

What it reproduces, measured on the x86 HTP emulator (docs/building.md, "A binary that does not repeat itself"):
- at 8-bit activations the shared output's scale (a step of ~1.3 pixels) crushes the scores: det_f1 falls while
  cosine and SQNR barely move (the boxes dominate both);
- at 16-bit activations its C2f-style blocks at 12x12 x 128 channels (Concat of two branches and a SiLU(Conv) of
  one) give other outputs on each run of the same binary and input; at 8 bit they repeat themselves.
Score: detections of the binary matched to the float model's (same class, IoU >= 0.5): det_f1 and box_iou."""
from pathlib import Path

import numpy as np

DATA_DIR = None
CHECKPOINTS = None

MODEL = Path(__file__).parent / "detector.onnx"
SIZE, CLASSES, BLOCKS, WIDTH = 96, 3, 4, 128
STEM_GAIN, HEAD_GAIN, CLASS_BIAS = 10.0, 2.0, -4.0
FRAME = 320  # boxes in pixels of the 320-pixel frame the input was scaled from (0..320, as YOLOv8n-320 gives)
CALIBRATION = ["astronaut", "coffee", "chelsea", "rocket", "camera", "horse", "page", "text"]
EVALUATION = ["cat", "coins", "clock", "brick", "grass", "moon"]


def write_model(path=MODEL, seed=0):
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(seed)
    nodes, weights = [], []

    def conv(name, x, cin, cout, k, stride=1, bias=None, gain=1.0):
        w = rng.standard_normal((cout, cin, k, k)) * gain * np.sqrt(2.0 / (cin * k * k))
        w = (w - w.mean(axis=(1, 2, 3), keepdims=True)).astype(np.float32)  # zero-mean filters: edges, not brightness
        b = (rng.standard_normal(cout) * 0.1 if bias is None else np.full(cout, bias)).astype(np.float32)
        weights.extend([numpy_helper.from_array(w, f"{name}.weight"), numpy_helper.from_array(b, f"{name}.bias")])
        nodes.append(helper.make_node("Conv", [x, f"{name}.weight", f"{name}.bias"], [f"{name}/Conv_output_0"],
                                      name=f"{name}/Conv", kernel_shape=[k, k], strides=[stride, stride],
                                      pads=[k // 2] * 4))
        return f"{name}/Conv_output_0"

    def silu(name, x):
        nodes.extend([helper.make_node("Sigmoid", [x], [f"{name}/Sigmoid_output_0"], name=f"{name}/Sigmoid"),
                      helper.make_node("Mul", [x, f"{name}/Sigmoid_output_0"], [f"{name}/Mul_output_0"],
                                       name=f"{name}/Mul")])
        return f"{name}/Mul_output_0"

    x = silu("/stem.0", conv("/stem.0", "images", 3, 16, 3, 2, gain=STEM_GAIN))
    x = silu("/stem.1", conv("/stem.1", x, 16, 32, 3, 2))
    x = silu("/stem.2", conv("/stem.2", x, 32, WIDTH, 3, 2))
    for i in range(BLOCKS):
        a = silu(f"/block.{i}/a", conv(f"/block.{i}/a", x, WIDTH, WIDTH, 1))
        b = silu(f"/block.{i}/b", conv(f"/block.{i}/b", x, WIDTH, WIDTH, 1))
        r = silu(f"/block.{i}/m", conv(f"/block.{i}/m", b, WIDTH, WIDTH, 3))
        nodes.append(helper.make_node("Concat", [a, b, r], [f"/block.{i}/Concat_output_0"], axis=1,
                                      name=f"/block.{i}/Concat"))
        out = silu(f"/block.{i}/out", conv(f"/block.{i}/out", f"/block.{i}/Concat_output_0", 3 * WIDTH, WIDTH, 1))
        nodes.append(helper.make_node("Add", [x, out], [f"/block.{i}/Add_output_0"], name=f"/block.{i}/Add"))
        x = f"/block.{i}/Add_output_0"
    anchors = (SIZE // 8) ** 2
    shape = numpy_helper.from_array(np.array([1, -1, anchors], np.int64), "/head/shape")
    # boxes anchored at grid cells, as YOLOv8's: a centre within its cell (stride 8), a size of 8 to 32 pixels
    cells = SIZE // 8
    grid_y, grid_x = np.meshgrid(np.arange(cells) * 8.0, np.arange(cells) * 8.0, indexing="ij")
    spans = np.stack([np.full_like(grid_x, 8.0), np.full_like(grid_x, 8.0), np.full_like(grid_x, 24.0),
                      np.full_like(grid_x, 24.0)])[None] * FRAME / SIZE
    starts = np.stack([grid_x, grid_y, np.full_like(grid_x, 8.0), np.full_like(grid_x, 8.0)])[None] * FRAME / SIZE
    spans, starts = spans.astype(np.float32), starts.astype(np.float32)
    weights += [shape, numpy_helper.from_array(spans, "/head/spans"), numpy_helper.from_array(starts, "/head/starts")]
    box = conv("/head/box", x, WIDTH, 4, 1, gain=HEAD_GAIN)
    cls = conv("/head/cls", x, WIDTH, CLASSES, 1, bias=CLASS_BIAS, gain=HEAD_GAIN)
    nodes += [helper.make_node("Sigmoid", [box], ["/head/box/Sigmoid_output_0"], name="/head/box/Sigmoid"),
              helper.make_node("Mul", ["/head/box/Sigmoid_output_0", "/head/spans"], ["/head/box/Mul_output_0"],
                               name="/head/box/Mul"),
              helper.make_node("Add", ["/head/box/Mul_output_0", "/head/starts"], ["/head/box/Add_output_0"],
                               name="/head/box/Add"),
              helper.make_node("Reshape", ["/head/box/Add_output_0", "/head/shape"], ["/head/box/Reshape_output_0"],
                               name="/head/box/Reshape"),
              helper.make_node("Sigmoid", [cls], ["/head/cls/Sigmoid_output_0"], name="/head/cls/Sigmoid"),
              helper.make_node("Reshape", ["/head/cls/Sigmoid_output_0", "/head/shape"],
                               ["/head/cls/Reshape_output_0"], name="/head/cls/Reshape"),
              helper.make_node("Concat", ["/head/box/Reshape_output_0", "/head/cls/Reshape_output_0"], ["output0"],
                               axis=1, name="/head/Concat")]
    graph = helper.make_graph(nodes, "detector", [helper.make_tensor_value_info("images", TensorProto.FLOAT,
                                                                                [1, 3, SIZE, SIZE])],
                              [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 4 + CLASSES, anchors])],
                              weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tests"), str(path))


def _image(name):
    import skimage.data
    from skimage.transform import resize
    image = np.asarray(getattr(skimage.data, name)(), dtype=np.float32)
    image = image / 255.0 if image.max() > 1.5 else image
    image = np.stack([image] * 3, -1) if image.ndim == 2 else image[..., :3]
    side = min(image.shape[:2])
    top, left = (image.shape[0] - side) // 2, (image.shape[1] - side) // 2
    image = resize(image[top:top + side, left:left + side], (SIZE, SIZE), anti_aliasing=True)
    return {"images": image.transpose(2, 0, 1)[None].astype(np.float32)}


def calibration_inputs(graph, count):
    return [_image(name) for name in (CALIBRATION * count)[:count]]


def evaluation_inputs(graph):
    return [_image(name) for name in EVALUATION]


def detections(output, threshold=0.25, overlap=0.45):
    """(boxes x1 y1 x2 y2, classes) after the score threshold and per-class NMS, as YOLOv8's post-processing."""
    prediction = output[0]
    boxes, scores = prediction[:4].T, prediction[4:].T
    classes, confidence = scores.argmax(1), scores.max(1)
    keep = confidence > threshold
    boxes, classes, confidence = boxes[keep], classes[keep], confidence[keep]
    corners = np.concatenate([boxes[:, :2] - boxes[:, 2:] / 2, boxes[:, :2] + boxes[:, 2:] / 2], 1)
    order, chosen = confidence.argsort()[::-1], []
    while len(order):
        best, order = order[0], order[1:]
        chosen.append(best)
        order = order[(iou(corners[best], corners[order]) < overlap) | (classes[order] != classes[best])]
    return corners[chosen], classes[chosen]


def iou(box, boxes):
    low = np.maximum(box[:2], boxes[:, :2])
    high = np.minimum(box[2:], boxes[:, 2:])
    inter = np.prod(np.clip(high - low, 0, None), axis=1)
    area = lambda b: np.prod(np.clip(b[..., 2:] - b[..., :2], 0, None), axis=-1)
    return inter / np.maximum(area(box) + area(boxes) - inter, 1e-9)


def score(graph, inputs, outputs, *, float_outputs):
    matched = extra = missed = 0
    overlaps = []
    for output, reference in zip(outputs, float_outputs):
        boxes, classes = detections(output["output0"])
        ref_boxes, ref_classes = detections(reference["output0"])
        free = np.ones(len(ref_boxes), bool)
        for box, cls in zip(boxes, classes):
            candidates = np.flatnonzero(free & (ref_classes == cls))
            best = iou(box, ref_boxes[candidates]) if len(candidates) else np.zeros(0)
            if len(best) and best.max() >= 0.5:
                free[candidates[best.argmax()]] = False
                matched += 1
                overlaps.append(float(best.max()))
            else:
                extra += 1
        missed += int(free.sum())
    f1 = 1.0 if matched + extra + missed == 0 else 2 * matched / (2 * matched + extra + missed)
    return {"det_f1": f1, "box_iou": float(np.mean(overlaps)) if overlaps else 0.0}

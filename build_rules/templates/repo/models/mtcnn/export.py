"""Build hooks for the MTCNN example model (P-Net, R-Net, O-Net).

The build tool imports this file to look the hooks up, so the module top level
only uses the standard library: torch, numpy and scikit-image are imported
inside the functions that need them.

Hooks:
    build(graph, checkpoints)        -> torch.nn.Module ready for ONNX export
    calibration_inputs(graph, count) -> list of {"image": float32 (1, 3, H, W)}
    evaluation_inputs(graph)         -> list of {"image": float32 (1, 3, H, W)}
    score(graph, inputs, outputs)    -> dict of task metrics

Weights are the MIT-licensed state dicts shipped in the facenet-pytorch wheel
(facenet_pytorch/data/{pnet,rnet,onet}.pt). The network definitions below are
written for this project; only the layer shapes and the pre-processing
constants of the original MTCNN are reused.

Pre-processing (all graphs): RGB, float32, NCHW, pixel p in [0, 255] mapped to
(p - 127.5) / 128, i.e. (x * 255 - 127.5) / 128 for x in [0, 1].
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - typing only
    import numpy as np
    import torch

GRAPHS = ("pnet", "rnet", "onet")

INPUT_NAME = "image"

# P-Net is fully convolutional; a context binary needs one static size.
# 1x3x120x160 (H x W) is a quarter-VGA pyramid level with a 4:3 aspect ratio:
#   * it is the pyramid level at which a 640x480 frame is searched for faces of
#     about 48 px (P-Net's window is 12 px, 640 / 160 = 4), and any larger
#     frame is simply tiled/rescaled to it by the caller;
#   * its output map is 55x75 windows (stride 2), enough to be a meaningful
#     detection map for the accuracy checks;
#   * the HTP emulator on x86 is 30-110x slower than the CPU EP and its cost
#     grows with the pixel count, so a small level keeps calibration checks and
#     evaluation runs quick (see the timings recorded in model.toml).
PNET_HW = (120, 160)

INPUT_HW = {"pnet": PNET_HW, "rnet": (24, 24), "onet": (48, 48)}

OUTPUT_NAMES = {
    "pnet": ("box_offsets", "face_prob_map"),
    "rnet": ("box", "face_prob"),
    "onet": ("box", "landmarks", "face_prob"),
}

# Images from the scikit-image wheel (no download needed).
# Calibration draws from these; astronaut also supplies the real face crops.
CALIBRATION_IMAGES = (
    "astronaut", "chelsea", "coffee", "coins", "horse", "rocket",
    "page", "text", "clock", "brick", "grass", "gravel", "moon",
)
# Held out from calibration; only used for the P-Net evaluation crops.
# camera contains a (small) human face, the others are clutter.
PNET_EVALUATION_IMAGES = (
    "camera", "stereo_motorcycle", "hubble_deep_field", "immunohistochemistry",
)

# Face box (rows, cols) in skimage.data.astronaut(): O-Net face prob ~1.0.
_ASTRONAUT_FACE = (80, 180, 170, 270)

# lfw_subset(): 200 grey 25x25 crops, first 100 faces then 100 non-faces.
# Both R-Net (at 24x24) and O-Net (at 48x48) are evaluated on all of them:
# on the HTP emulator an R-Net inference takes 5-10 ms, so the full set costs
# about 2 s per variant and gives an accuracy gate as fine-grained as O-Net's.
_LFW_FACES = 100

_SEED = 20240607


def _check_graph(graph: str) -> None:
    if graph not in GRAPHS:
        raise ValueError(f"unknown MTCNN graph {graph!r}; expected one of {GRAPHS}")


# --------------------------------------------------------------------------
# Networks
# --------------------------------------------------------------------------

@lru_cache(maxsize=None)
def _net_classes() -> dict[str, Any]:
    """Define the three networks (needs torch, so done lazily)."""
    import torch
    from torch import nn

    def conv_block(module: nn.Module, idx: int, cin: int, cout: int, k: int) -> None:
        setattr(module, f"conv{idx}", nn.Conv2d(cin, cout, kernel_size=k))
        setattr(module, f"prelu{idx}", nn.PReLU(cout))

    def flatten_whc(x: torch.Tensor) -> torch.Tensor:
        # The original (Caffe-trained) dense weights expect the feature map
        # flattened in (N, C, W, H) order, not PyTorch's (N, C, H, W).
        return x.permute(0, 3, 2, 1).reshape(x.shape[0], -1)

    class PNet(nn.Module):
        """Proposal net: 12x12 window classifier, fully convolutional."""

        def __init__(self) -> None:
            super().__init__()
            conv_block(self, 1, 3, 10, 3)
            self.pool1 = nn.MaxPool2d(2, 2, ceil_mode=True)
            conv_block(self, 2, 10, 16, 3)
            conv_block(self, 3, 16, 32, 3)
            self.conv4_1 = nn.Conv2d(32, 2, kernel_size=1)  # face / non-face
            self.conv4_2 = nn.Conv2d(32, 4, kernel_size=1)  # box regression
            self.softmax4_1 = nn.Softmax(dim=1)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x = self.pool1(self.prelu1(self.conv1(x)))
            x = self.prelu2(self.conv2(x))
            x = self.prelu3(self.conv3(x))
            return self.conv4_2(x), self.softmax4_1(self.conv4_1(x))

    class RNet(nn.Module):
        """Refine net: 24x24 crop classifier."""

        def __init__(self) -> None:
            super().__init__()
            conv_block(self, 1, 3, 28, 3)
            self.pool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
            conv_block(self, 2, 28, 48, 3)
            self.pool2 = nn.MaxPool2d(3, 2, ceil_mode=True)
            conv_block(self, 3, 48, 64, 2)
            self.dense4 = nn.Linear(64 * 3 * 3, 128)
            self.prelu4 = nn.PReLU(128)
            self.dense5_1 = nn.Linear(128, 2)
            self.dense5_2 = nn.Linear(128, 4)
            self.softmax5_1 = nn.Softmax(dim=1)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x = self.pool1(self.prelu1(self.conv1(x)))
            x = self.pool2(self.prelu2(self.conv2(x)))
            x = self.prelu3(self.conv3(x))
            x = self.prelu4(self.dense4(flatten_whc(x)))
            return self.dense5_2(x), self.softmax5_1(self.dense5_1(x))

    class ONet(nn.Module):
        """Output net: 48x48 crop classifier with box and 5 landmarks."""

        def __init__(self) -> None:
            super().__init__()
            conv_block(self, 1, 3, 32, 3)
            self.pool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
            conv_block(self, 2, 32, 64, 3)
            self.pool2 = nn.MaxPool2d(3, 2, ceil_mode=True)
            conv_block(self, 3, 64, 64, 3)
            self.pool3 = nn.MaxPool2d(2, 2, ceil_mode=True)
            conv_block(self, 4, 64, 128, 2)
            self.dense5 = nn.Linear(128 * 3 * 3, 256)
            self.prelu5 = nn.PReLU(256)
            self.dense6_1 = nn.Linear(256, 2)
            self.dense6_2 = nn.Linear(256, 4)
            self.dense6_3 = nn.Linear(256, 10)
            self.softmax6_1 = nn.Softmax(dim=1)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            x = self.pool1(self.prelu1(self.conv1(x)))
            x = self.pool2(self.prelu2(self.conv2(x)))
            x = self.pool3(self.prelu3(self.conv3(x)))
            x = self.prelu4(self.conv4(x))
            x = self.prelu5(self.dense5(flatten_whc(x)))
            return self.dense6_2(x), self.dense6_3(x), self.softmax6_1(self.dense6_1(x))

    class Exportable(nn.Module):
        """Fixed-shape export wrapper.

        Calls the wrapped net with one tensor named ``image`` and returns its
        outputs as a tuple in the order of ``output_names``. The attributes
        describe the static signature for exporters that want it.
        """

        def __init__(self, net: nn.Module, graph: str) -> None:
            super().__init__()
            self.net = net
            self.graph = graph
            self.input_names = (INPUT_NAME,)
            self.output_names = OUTPUT_NAMES[graph]
            self.input_shape = (1, 3, *INPUT_HW[graph])

        def example_inputs(self) -> tuple[torch.Tensor]:
            return (torch.zeros(self.input_shape, dtype=torch.float32),)

        def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return tuple(self.net(image))

    return {"pnet": PNet, "rnet": RNet, "onet": ONet, "wrapper": Exportable}


def build(graph: str, checkpoints: dict[str, Path]) -> "torch.nn.Module":
    """Return the eval-mode export wrapper for ``graph`` with its weights loaded.

    ``checkpoints`` maps checkpoint file names (``"pnet.pt"`` ...) to paths.
    """
    import torch

    _check_graph(graph)
    wanted = f"{graph}.pt"
    by_name = {Path(str(k)).name: Path(v) for k, v in checkpoints.items()}
    if wanted in by_name:
        path = by_name[wanted]
    elif len(by_name) == 1:
        path = next(iter(by_name.values()))
    else:
        raise KeyError(f"{graph}: checkpoint {wanted!r} not in {sorted(by_name)}")

    classes = _net_classes()
    net = classes[graph]()
    state = torch.load(path, map_location="cpu", weights_only=True)
    net.load_state_dict(state, strict=True)
    model = classes["wrapper"](net, graph)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


# --------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------

@lru_cache(maxsize=None)
def _image(name: str) -> "np.ndarray":
    """skimage.data image as read-only float64 RGB in [0, 1], shape (H, W, 3)."""
    import numpy as np
    import skimage.data
    from skimage.util import img_as_float

    img = getattr(skimage.data, name)()
    if isinstance(img, tuple):  # stereo_motorcycle returns (left, right, disp)
        img = img[0]
    img = img_as_float(np.asarray(img))
    if img.ndim == 2:
        img = np.repeat(img[:, :, None], 3, axis=2)
    img = np.ascontiguousarray(img[:, :, :3], dtype=np.float64)
    img.setflags(write=False)
    return img


@lru_cache(maxsize=None)
def _lfw() -> "np.ndarray":
    import numpy as np
    import skimage.data

    faces = np.asarray(skimage.data.lfw_subset(), dtype=np.float64)  # (200, 25, 25)
    faces.setflags(write=False)
    return faces


def _to_input(rgb: "np.ndarray") -> dict[str, "np.ndarray"]:
    """(H, W, 3) RGB in [0, 1] -> {"image": float32 (1, 3, H, W) normalised}."""
    import numpy as np

    x = np.clip(rgb, 0.0, 1.0) * 255.0
    x = (x - 127.5) / 128.0
    x = np.ascontiguousarray(x.transpose(2, 0, 1)[None], dtype=np.float32)
    return {INPUT_NAME: x}


def _resize(img: "np.ndarray", out_hw: tuple[int, int]) -> "np.ndarray":
    from skimage.transform import resize

    if img.ndim == 2:
        out_shape: tuple[int, ...] = out_hw
    else:
        out_shape = (*out_hw, img.shape[2])
    downscale = img.shape[0] > out_hw[0] or img.shape[1] > out_hw[1]
    return resize(img, out_shape, order=1, mode="edge", anti_aliasing=downscale,
                  preserve_range=True)


def _crop_resize(img: "np.ndarray", top: float, left: float, h: float, w: float,
                 out_hw: tuple[int, int]) -> "np.ndarray":
    """Crop a box (clamped to the image) and resize it to ``out_hw``."""
    H, W = img.shape[:2]
    h = int(round(min(max(h, 4), H)))
    w = int(round(min(max(w, 4), W)))
    t = int(round(min(max(top, 0), H - h)))
    l = int(round(min(max(left, 0), W - w)))
    return _resize(img[t:t + h, l:l + w], out_hw)


def _random_crop(rng: "np.random.Generator", img: "np.ndarray", out_hw: tuple[int, int],
                 min_frac: float, max_frac: float) -> "np.ndarray":
    """Crop with the output's aspect ratio, side a random fraction of the image."""
    H, W = img.shape[:2]
    aspect = out_hw[0] / out_hw[1]  # h / w
    max_w = min(W, H / aspect)
    w = max_w * rng.uniform(min_frac, max_frac)
    h = w * aspect
    top = rng.uniform(0, H - h)
    left = rng.uniform(0, W - w)
    return _crop_resize(img, top, left, h, w, out_hw)


def _face_crop(rng: "np.random.Generator", out_hw: tuple[int, int]) -> "np.ndarray":
    """Jittered square crop around the astronaut's face (R-Net/O-Net style box)."""
    r0, r1, c0, c1 = _ASTRONAUT_FACE
    size = (r1 - r0) * rng.uniform(0.8, 1.25)
    cy = (r0 + r1) / 2 + (r1 - r0) * rng.uniform(-0.15, 0.15)
    cx = (c0 + c1) / 2 + (c1 - c0) * rng.uniform(-0.15, 0.15)
    return _crop_resize(_image("astronaut"), cy - size / 2, cx - size / 2, size, size, out_hw)


def _scene_with_face(rng: "np.random.Generator", out_hw: tuple[int, int]) -> "np.ndarray":
    """P-Net style crop of the astronaut that contains the face at 12-40 px."""
    img = _image("astronaut")
    r0, r1, c0, c1 = _ASTRONAUT_FACE
    aspect = out_hw[0] / out_hw[1]
    face_px = rng.uniform(12.0, 40.0)             # face size in the output
    w = min(img.shape[1], (r1 - r0) * out_hw[1] / face_px, img.shape[0] / aspect)
    h = w * aspect
    # Position the window so that the face lies inside it.
    top = rng.uniform(r1 - h, r0)
    left = rng.uniform(c1 - w, c0)
    return _crop_resize(img, top, left, h, w, out_hw)


def calibration_inputs(graph: str, count: int) -> list[dict[str, "np.ndarray"]]:
    """``count`` deterministic calibration samples for ``graph``.

    Sample ``i`` depends only on (graph, i), so a longer list starts with the
    shorter one. R-Net/O-Net: every third sample is a jittered face crop (the
    astronaut), the rest are crops of textures/objects, mimicking the mix of
    candidate boxes those stages see. P-Net: every fourth sample is a scene
    crop containing a 12-40 px face, the rest are large scene crops.
    No lfw_subset image is used (that is the evaluation set).
    """
    import numpy as np

    _check_graph(graph)
    if count < 0:
        raise ValueError("count must be >= 0")
    out_hw = INPUT_HW[graph]
    gidx = GRAPHS.index(graph)
    samples = []
    for i in range(count):
        rng = np.random.default_rng([_SEED, gidx, i])
        if graph == "pnet":
            if i % 4 == 0:
                rgb = _scene_with_face(rng, out_hw)
            else:
                name = CALIBRATION_IMAGES[(i - i // 4 - 1) % len(CALIBRATION_IMAGES)]
                rgb = _random_crop(rng, _image(name), out_hw, 0.35, 1.0)
        else:
            if i % 3 == 0:
                rgb = _face_crop(rng, out_hw)
            else:
                name = CALIBRATION_IMAGES[(i - i // 3 - 1) % len(CALIBRATION_IMAGES)]
                rgb = _random_crop(rng, _image(name), out_hw, 0.05, 0.6)
        samples.append(_to_input(rgb))
    return samples


def evaluation_inputs(graph: str) -> list[dict[str, "np.ndarray"]]:
    """Deterministic evaluation inputs.

    onet: all 200 lfw_subset crops (100 faces then 100 non-faces) at 48x48.
    rnet: the same 200 crops at 24x24.
    pnet: 4 centre crops of images never used for calibration, at 120x160.
    Grey crops are repeated over the three RGB channels.
    """
    import numpy as np

    _check_graph(graph)
    out_hw = INPUT_HW[graph]
    if graph in ("onet", "rnet"):
        return [_to_input(np.repeat(_resize(face, out_hw)[:, :, None], 3, axis=2))
                for face in _lfw()]

    samples = []
    for name in PNET_EVALUATION_IMAGES:
        img = _image(name)
        H, W = img.shape[:2]
        aspect = out_hw[0] / out_hw[1]
        w = min(W, H / aspect)
        h = w * aspect
        # Largest centred window with the input's aspect ratio.
        samples.append(_to_input(_crop_resize(img, (H - h) / 2, (W - w) / 2, h, w, out_hw)))
    return samples


# --------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------

def _labels(graph: str) -> list[int] | None:
    if graph in ("onet", "rnet"):
        return [1] * _LFW_FACES + [0] * _LFW_FACES
    return None


def score(graph: str, inputs: list[dict[str, "np.ndarray"]],
          outputs: list[dict[str, "np.ndarray"]]) -> dict[str, float]:
    """Task metrics on ``evaluation_inputs(graph)`` and the matching outputs.

    onet/rnet: {"accuracy": share of the 200 lfw_subset crops where
    face_prob[..., 1] > 0.5 agrees with the label (face = first 100)}.
    pnet: {} (no labels; gate on cosine against the float model).
    """
    import numpy as np

    _check_graph(graph)
    labels = _labels(graph)
    if labels is None:
        return {}
    if len(outputs) != len(labels) or len(inputs) != len(labels):
        raise ValueError(f"{graph}: expected {len(labels)} evaluation samples, got "
                         f"{len(inputs)} inputs and {len(outputs)} outputs")
    correct = 0
    for label, out in zip(labels, outputs):
        prob = np.asarray(out["face_prob"], dtype=np.float64).reshape(-1, 2)
        predicted = int(prob[0, 1] > 0.5)
        correct += int(predicted == label)
    return {"accuracy": correct / len(labels)}

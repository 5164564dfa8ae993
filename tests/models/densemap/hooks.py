"""Hooks of the dense-map test model: a small DBNet-like text detector (strided Convs down, ConvTransposes up with
skips, a sigmoid text map out), trained here on scikit-image photos with text drawn on them.

Inputs are real photos (scikit-image's wheel data) with one to three lines of text drawn on each with Pillow's
built-in font; each line's box (x0, y0, x1, y1 in pixels) is the sample's label. The weights are det.npz (70 KB),
made once by train(): a seeded, single-threaded training run of a few seconds on other crops of the same photos, so
the float model really finds text and its map is mostly zeros, as a detector's is. They are shipped, not trained at
build time: seeded and single-threaded, the run still gives other weights on another CPU (torch's kernels differ
between AVX2 and AVX-512: measured, three capabilities, three sets of weights). Such weights failed w8a16's
line_recall gate on one machine (0.8182 < 0.859) and found 6 of 11 lines in float on another (0.545 < 0.7), where
w4a16 then passed the gate that tests/test_densemap.py needs it to fail. `python hooks.py` writes det.npz again (and
then the test's numbers and the weight overrides diagnose proposes may change).
"""
import numpy as np

H, W = 64, 96
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "camera", "coins", "moon", "brick", "gravel")
WORDS = ("SALE", "exit 4", "Open 24h", "No parking", "ROUTE 66", "cafe", "Platform 2", "tickets", "STOP", "menu")
THRESHOLD = 0.5  # the map's text / background cut, as DBNet's binarisation


def module_class():
    import torch
    from torch import nn

    def down(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, stride=2, padding=1), nn.ReLU())

    class DenseMap(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
            self.down1, self.down2, self.down3 = down(8, 16), down(16, 24), down(24, 32)  # 1/2, 1/4, 1/8
            self.up3 = nn.ConvTranspose2d(32, 24, 2, stride=2)  # 1/8 -> 1/4
            self.up2 = nn.ConvTranspose2d(24, 16, 2, stride=2)  # 1/4 -> 1/2
            self.head = nn.Sequential(nn.Conv2d(16, 8, 3, padding=1), nn.ReLU())
            self.up1 = nn.ConvTranspose2d(8, 1, 2, stride=2)  # 1/2 -> full size: the text logits

        def forward(self, image):
            c1 = self.down1(self.stem(image))
            c2 = self.down2(c1)
            c3 = self.down3(c2)
            p2 = torch.relu(self.up3(c3) + c2)
            p1 = torch.relu(self.up2(p2) + c1)
            return torch.sigmoid(self.up1(self.head(p1)))

    return DenseMap


def _photos():
    import skimage.data
    from skimage.color import gray2rgb
    found = []
    for name in PHOTOS:
        image = np.asarray(getattr(skimage.data, name)(), dtype=np.uint8)
        found.append(gray2rgb(image) if image.ndim == 2 else image[..., :3])
    return found


def samples(count: int, seed: int) -> list[tuple[dict, dict]]:
    """(inputs, label) pairs: a crop of a photo, resized to H x W, with text lines drawn on it; label["boxes"] holds
    each line's box."""
    from PIL import Image, ImageDraw, ImageFont
    rng = np.random.default_rng(seed)
    photos = _photos()
    fonts = [ImageFont.load_default(size=s) for s in (9, 11, 13)]
    out = []
    for i in range(count):
        photo = photos[int(rng.integers(len(photos)))]
        scale = rng.uniform(0.4, 1.0)
        h, w = int(photo.shape[0] * scale), int(photo.shape[1] * scale)
        top, left = int(rng.integers(0, photo.shape[0] - h + 1)), int(rng.integers(0, photo.shape[1] - w + 1))
        canvas = Image.fromarray(photo[top:top + h, left:left + w]).resize((W, H), Image.BILINEAR)
        draw = ImageDraw.Draw(canvas)
        boxes = []
        for _ in range(int(rng.integers(1, 4))):
            font = fonts[int(rng.integers(len(fonts)))]
            word = WORDS[int(rng.integers(len(WORDS)))]
            x0, y0, x1, y1 = draw.textbbox((0, 0), word, font=font)
            x = int(rng.integers(0, max(1, W - (x1 - x0))))
            y = int(rng.integers(0, max(1, H - (y1 - y0))))
            if any(not (x + x1 < a or x + x0 > c or y + y1 < b or y + y0 > d) for a, b, c, d in boxes):
                continue  # no overlapping lines: each box is one line
            shade = int(rng.integers(0, 2)) * 255  # dark or light text
            draw.text((x, y), word, font=font, fill=(shade, shade, 255 - shade if shade else 40))
            boxes.append((x + x0, y + y0, x + x1, y + y1))
        image = np.asarray(canvas, dtype=np.float32) / 255.0
        x = ((image - 0.5) / 0.25).transpose(2, 0, 1)[None].astype(np.float32)
        out.append(({"image": x}, {"boxes": np.array(boxes, dtype=np.int32).reshape(-1, 4)}))
    return out


def box_mask(boxes) -> np.ndarray:
    mask = np.zeros((H, W), dtype=np.float32)
    for x0, y0, x1, y1 in np.asarray(boxes).reshape(-1, 4):
        mask[y0:y1, x0:x1] = 1.0
    return mask


def train(steps: int = 160, seed: int = 0):
    """The detector, trained: seeded and single-threaded, yet its weights depend on the CPU's vector unit (see the
    module's docstring): write_weights() ran it once, and build() loads what it wrote."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(seed)
        module = module_class()()
        data = samples(64, seed=1000 + seed)
        images = torch.from_numpy(np.concatenate([s[0]["image"] for s in data]))
        masks = torch.from_numpy(np.stack([box_mask(s[1]["boxes"]) for s in data]))[:, None]
        optimizer = torch.optim.Adam(module.parameters(), lr=0.01)
        order = np.random.default_rng(seed)
        for _ in range(steps):
            batch = torch.from_numpy(order.choice(len(data), 8, replace=False))
            loss = torch.nn.functional.binary_cross_entropy(module(images[batch]), masks[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return module.eval()
    finally:
        torch.set_num_threads(threads)


def build(graph, checkpoints):
    """The detector with det.npz's weights (model.toml's checkpoint)."""
    import torch
    module = module_class()()
    with np.load(checkpoints[0]) as weights:
        module.load_state_dict({name: torch.from_numpy(weights[name]) for name in weights.files})
    return module.eval()


def write_weights(path, seed: int = 1) -> None:
    """det.npz: train()'s weights, one array per state_dict entry. Seed 1 on an AVX-512 machine made the shipped
    file: its w4a16 without weight overrides fails its gate (as tests/test_densemap.py needs), seed 0's there did not."""
    np.savez(path, **{name: value.numpy() for name, value in train(seed=seed).state_dict().items()})


def calibration_inputs(graph, count):
    return [inputs for inputs, _ in samples(count, seed=1)]


def evaluation_inputs(graph):
    return samples(6, seed=2)


def score(graph, inputs, outputs, *, float_outputs, labels=None):
    """text_iou: the text pixels (map > 0.5) against the float model's, intersection over union over the whole
    set; line_recall (with labels): the share of labelled lines whose box is at least half text pixels."""
    ours = np.stack([o["text_map"].reshape(H, W) > THRESHOLD for o in outputs])
    theirs = np.stack([o["text_map"].reshape(H, W) > THRESHOLD for o in float_outputs])
    union = np.logical_or(ours, theirs).sum()
    metrics = {"text_iou": float(np.logical_and(ours, theirs).sum() / union) if union else 1.0}
    if labels is not None:
        found = total = 0
        for text, label in zip(ours, labels):
            for x0, y0, x1, y1 in np.asarray(label["boxes"]).reshape(-1, 4):
                total += 1
                found += bool(text[y0:y1, x0:x1].mean() >= 0.5)
        metrics["line_recall"] = found / total if total else 1.0
    return metrics


if __name__ == "__main__":
    from pathlib import Path
    write_weights(Path(__file__).with_name("det.npz"))

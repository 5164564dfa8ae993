"""Crops of scikit-image's scanned page, text sign and astronaut photo, normalised as PP-OCR's detector expects
(ImageNet mean/std, NCHW, 160 x 320); score(): text_iou, the text pixels of the probability map (DBNet's
threshold 0.3, as rapidocr binarizes it) against the float model's, intersection over union over the set."""
H, W = 160, 320


def _crops(count, seed):
    import numpy as np
    import skimage.data
    from skimage.color import gray2rgb
    from skimage.transform import resize
    images = [gray2rgb(skimage.data.page()), gray2rgb(skimage.data.text()), skimage.data.astronaut()]
    rng = np.random.default_rng(seed)
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    out = []
    for i in range(count):
        img = images[i % len(images)] / 255.0
        scale = rng.uniform(0.5, 1.0)
        h, w = int(img.shape[0] * scale), int(img.shape[1] * scale)
        top, left = int(rng.integers(0, img.shape[0] - h + 1)), int(rng.integers(0, img.shape[1] - w + 1))
        crop = resize(img[top:top + h, left:left + w], (H, W), anti_aliasing=True)
        x = ((crop - mean) / std).transpose(2, 0, 1)[None].astype(np.float32)
        out.append({"x": x})
    return out


def calibration_inputs(graph, count):
    return _crops(count, 0)


def evaluation_inputs(graph):
    return _crops(8, 1)


THRESHOLD = 0.3  # rapidocr's DBPostProcess thresh: a pixel above it is text


def score(graph, inputs, outputs, *, float_outputs, labels=None):
    import numpy as np
    ours = np.stack([next(iter(o.values())) > THRESHOLD for o in outputs])
    theirs = np.stack([next(iter(o.values())) > THRESHOLD for o in float_outputs])
    union = np.logical_or(ours, theirs).sum()
    return {"text_iou": float(np.logical_and(ours, theirs).sum() / union) if union else 1.0}

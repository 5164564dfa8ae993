"""R-Net W4A16 on the HTP emulator (SM8750), 64 calibration and 200 evaluation crops (not a test): per-channel int4
against LPBQ in blocks of 64 and 16, with onnxruntime's min-max and AIMET's, with and without the three convolutions'
weights at int8 (weight_overrides), and W8A16. Prints box / face_prob cosine, binary bytes and the compiled graph's
weight encodings.   python bench/lpbq_rnet.py <empty folder>   (docs/block_quantization.md)"""
import sys, json, re
ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests")); sys.path.insert(0, str(ROOT))
from pathlib import Path
from test_aimet import rnet_repo
from conftest import run_doit
V = """
[variants.w4a16]
activations = "uint16"
weights = "int4"
calibration = { method = "minmax", samples = 64 }

[variants.lpbq64]
inherits = "w4a16"
block_size = 64

[variants.lpbq16]
inherits = "w4a16"
block_size = 16

[variants.lpbq64_aimet]
inherits = "lpbq64"
quantizer = "aimet"

[variants.lpbq16_aimet]
inherits = "lpbq16"
quantizer = "aimet"

[variants.lpbq16_conv8]
inherits = "lpbq16"
weight_overrides = { node_conv2d = "int8", node_conv2d_1 = "int8", node_conv2d_2 = "int8" }

[variants.w4a16_conv8]
inherits = "w4a16"
weight_overrides = { node_conv2d = "int8", node_conv2d_1 = "int8", node_conv2d_2 = "int8" }

[variants.lpbq16_aimet_conv8]
inherits = "lpbq16_aimet"
weight_overrides = { node_conv2d = "int8", node_conv2d_1 = "int8", node_conv2d_2 = "int8" }

[variants.w8a16]
activations = "uint16"
weights = "int8"
calibration = { method = "minmax", samples = 64 }
"""
repo = rnet_repo(Path(sys.argv[1]), V)
toml = repo / "models/mtcnn/model.toml"
t = toml.read_text().replace("calibration_samples = 16", "calibration_samples = 64")
t = re.sub(r'chips = \[.*?\]', 'chips = ["SM8750"]', t, count=1)
t = t.replace('gate = { metric = "cosine", min = 0.95 }', 'gate = { metric = "cosine", min = 0.5 }')
toml.write_text(t)
r = run_doit(repo, "--continue")
print(r.code, r.output[-2500:])
for v in ("w4a16", "lpbq64", "lpbq16", "lpbq64_aimet", "lpbq16_aimet", "w4a16_conv8", "lpbq16_conv8",
          "lpbq16_aimet_conv8", "w8a16"):
    d = repo / f"out/mtcnn/{v}/SM8750"
    try:
        c = json.loads((d / "rnet.check.json").read_text()); comp = json.loads((d / "rnet.compile.json").read_text())
        print(v, "box cos %.4f" % c["outputs"]["box"]["cosine"], "prob cos %.4f" % c["outputs"]["face_prob"]["cosine"],
              "bytes", comp["bytes"], comp.get("weight_encodings"))
    except Exception as e:
        print(v, "ERR", e)
    log = repo / f"out/mtcnn/{v}/rnet.quantize.log"
    if log.exists(): print("".join(l for l in log.read_text().splitlines(True) if "LPBQ" in l or "per-channel (" in l))

import sys, traceback, runpy, tempfile
sys.path.insert(0, "/work/wt-lpbq")
from pathlib import Path
import types, os
if os.environ.get("STUB_TV"):
    tv = types.ModuleType("torchvision"); tv.__path__ = []; ops = types.ModuleType("torchvision.ops"); tv.ops = ops; ops.roi_align = ops.nms = ops.batched_nms = ops.RoIAlign = None
    sys.modules["torchvision"] = tv; sys.modules["torchvision.ops"] = ops
from build_rules.toolchains import ort_qnn
from build_rules.stages.aimet import htp_config
from aimet_onnx.quantsim import QuantizationSimModel
from aimet_onnx.adascale.adascale_optimizer import AdaScale, adascale_model_config_dict, AdaScaleModelConfig
flt = sys.argv[1]
hooks = runpy.run_path(sys.argv[2])
model = ort_qnn.preprocessed_model(flt)
tmp = tempfile.mkdtemp()
config, _ = htp_config("v79", True, Path(tmp))
sim = QuantizationSimModel(model, param_type="int4", activation_type="int16", config_file=str(config), path=tmp)
for mt in ("llama", "custom"):
    try:
        cfg = adascale_model_config_dict.get(mt) or AdaScaleModelConfig(model_type=mt)
        AdaScale.apply_adascale(sim, hooks["calibration_inputs"]("block", 4), cfg, num_iterations=10)
        print(mt, "RAN")
    except Exception as e:
        print(mt, "FAILED:", type(e).__name__, str(e)[:400])

"""Does the HTP emulator's "Accelerator (execute) time (cycles)" depend on how busy the host is? (not a test)

    python bench/emulator_cycles_load.py [N]

One MobileNet-v2 fp16 context binary for SM8750 (cycles_vs_aihub.py's model), 5 detailed-profile runs idle, 5 with
N busy shell loops (default 2), 5 idle again; prints the median, min and max of each phase. Run it on an otherwise
idle machine. Result: docs/benchmarks.md, "Emulator cycles against phone latency".
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    import torch

    import cycles_vs_aihub as bench
    from build_rules.toolchains import ort_qnn
    loops = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    with tempfile.TemporaryDirectory(prefix="cycles-load-") as tmp:
        onnx_path = Path(tmp) / "mobilenet_v2.onnx"
        torch.onnx.export(bench.models()["mobilenet_v2"].eval(), (torch.zeros(1, 3, 224, 224),), str(onnx_path),
                          dynamo=False, opset_version=17, input_names=["image"], output_names=["logits"])
        bench._simplify(onnx_path)
        ctx = Path(ort_qnn.compile_context_binary(onnx_path, Path(tmp) / "ctx", "m", soc_model=bench.SOC["SM8750"],
                                                  vtcm_mb=8, fp16=True)["ctx_model"])

        def phase(name: str) -> None:
            counted = [bench.cycles(ctx, 1) / 1e6 for _ in range(5)]
            print(f"| {name} | {statistics.median(counted):.1f} M ({min(counted):.1f}-{max(counted):.1f}) |",
                  flush=True)

        print("| host | emulator cycles, median (min-max) |\n|---|---|")
        phase("idle")
        busy = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(loops)]
        try:
            time.sleep(2)
            phase(f"{loops} busy loops")
        finally:
            for p in busy:
                p.kill()
        time.sleep(2)
        phase("idle again")
    return 0


if __name__ == "__main__":
    sys.exit(main())

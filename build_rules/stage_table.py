"""The stage table: one record per stage, in the pipeline's order (the number each stage's line in `doit list`
starts with).

From a name in `doit list` (`compile:mtcnn/onet/w8a16@SM8750`) the row gives:
- doc: the stage's line in `doit list` (a toolchain's generator may yield its own, naming the SDK);
- generators: the task generator, per toolchain ("any" when both share it), as "<module>:<function>" in
  build_rules/tasks/ (tasks/__init__.py makes the doit creator task_<name> from it);
- workers: the code a task runs, per toolchain ("any", "ort-qnn", "qairt", or "qairt/<flow>" where the qairt flows
  differ), each with what keys its tasks: the key's stage name, its version, the Python tools whose version can
  change its output, whether the toolchain identity is in the key (SDK-dependent), whether the build cache may key it
  by content alone (relocatable), and whether it runs inside doit (in-process) instead of in a subprocess.

Bump a worker's version when its output for the same inputs changes: it re-runs that stage everywhere. A stage that
keeps a memo of its own measurements names that memo's version for what it is (check.MEASUREMENT_VERSION, ...).
A row with no generator (evaluate_float) is a key only: another stage's generator makes its tasks.

Light: imports nothing but the record decorator (doit loads it on every run).
"""
from __future__ import annotations

from .plumbing.records import record


@record
class Worker:
    module: str | None  # build_rules/stages/<module>.py (run(params)); None: the generator's own in-process action
    key: str  # the "stage" in the task key ("qairt-<stage>" for the qairt toolchain's)
    version: int
    tools: tuple = ()
    sdk: bool = False  # the toolchain identity (SDK version, build ids) is in the key
    relocatable: bool = False  # no path is written into its outputs: the build cache keys it by content alone
    in_process: bool = False  # runs inside doit (light), not in a stage subprocess


@record
class Stage:
    name: str
    doc: str
    generators: dict  # toolchain ("any", "ort-qnn", "qairt") -> "<module in build_rules/tasks>:<function>"
    workers: dict  # "any" | "ort-qnn" | "qairt" | "qairt/<flow>" -> Worker


def _w(module, version, tools=(), key=None, **flags) -> Worker:
    return Worker(module=module, key=key or module, version=version, tools=tuple(tools), **flags)


def _q(stage, module, version, tools=(), **flags) -> Worker:
    """A qairt worker: its key is "qairt-<stage>" and always holds the toolchain identity."""
    return Worker(module=module, key=f"qairt-{stage}", version=version, tools=tuple(tools), sdk=True, **flags)


STAGES: tuple[Stage, ...] = (
    Stage("data", "0 data: the model's prepare_data hook makes its real inputs (e.g. speech clips) -> data/",
          {"any": "pipeline:_data_tasks"}, {"any": _w("data", 1)}),
    Stage("export", "1 export: checkpoint + build hook -> ONNX (static shapes, int32, batch 1)",
          {"any": "pipeline:_export_tasks"},
          {"any": _w("export", 2, ("torch", "onnxscript", "numpy"))}),  # 2: exporter and opset per graph
    Stage("simplify", "2 simplify: onnxsim, then check static shapes and no int64 on graph I/O; I/O summary + op "
          "inventory", {"any": "pipeline:_simplify_tasks"},
          # 2: Constant nodes -> initializers, constants folded, opset >= 13; 3: shared biases copied per node
          {"any": _w("simplify", 3, ("onnx", "onnxsim"), relocatable=True)}),
    Stage("verify", "3 verify: ONNX Runtime CPU vs PyTorch on real inputs, within the model's tolerance",
          {"any": "pipeline:_verify_tasks"},
          # 2: frame_cosine; 3: two zero frames agree (samples.ZERO_FRAME)
          {"any": _w("verify", 3, ("onnxruntime", "torch", "numpy"), relocatable=True)}),
    Stage("size", "3b size: a graph's estimated context binary per variant against the budget (max_context_mb), "
          "before compiling", {"any": "split:size_tasks"},
          {"any": _w("size", 1, ("onnx", "numpy"), in_process=True)}),
    Stage("split", "3c split: [graphs.X] split: cut into sequential parts (plan + float parts; per quantized "
          "variant, QDQ parts)", {"any": "split:split_tasks"},
          # 2: no cut at a tensor the quantizer folds away (a Relu's input)
          {"any": _w("split", 2, ("onnxruntime", "onnx", "numpy"))}),
    Stage("calibrate", "4 calibrate: real calibration inputs -> raw files + input_list.txt (QNN format, shared by "
          "variants)", {"any": "pipeline:_calibrate_tasks"}, {"any": _w("calibrate", 1, ("numpy",))}),
    Stage("calibration_stats", "4b calibration stats: tensor ranges per float model, method and sample count "
          "(ort-qnn; shared by variants)", {"ort-qnn": "pipeline:_calibration_stats_tasks"},
          {"ort-qnn": _w("calibration_stats", 1, ("onnxruntime", "onnx", "numpy"), relocatable=True)}),
    Stage("quantize", "5 quantize: QDQ model per precision variant from the shared calibration ranges (fp16 "
          "variants skip this)", {"ort-qnn": "pipeline:_quantize_tasks", "qairt": "qairt:quantize"},
          # ort-qnn: 2: warns about graph outputs clamped by an activation; 3: an invalid QDQ model fails here;
          # 4: LayerNorm scales stay uint8 under signed weights; 5: LPBQ blocks 1x1 Conv2d weights, and a table a
          # Gather reads stays per tensor whatever a MatMul's weight override asks (both change QDQ models); 6: under
          # int4 weights, the convolutions the HTP takes at no int4 stay int8 (block_quant.int4_refused); 7: writes
          # <graph>.quantize.json and warns about Concats whose narrow inputs the shared scale crushes (concat_slices);
          # 8: an element-wise op's constant takes the type its op runs at, one copy per type when ops of both types
          # read it (elementwise_constants: a mixed variant's Muls ran in float). Sensitivity, tune and diagnose
          # quantize in-process with the same code: bump them with it
          {"ort-qnn": _w("quantize", 8, ("onnxruntime", "onnx", "numpy"), relocatable=True),
           "qairt/dlc": _q("quantize", "dlc_quantize", 1, ("numpy",))}),
    Stage("aimet", "5 aimet: QDQ model + encodings JSON per variant with quantizer = \"aimet\" (AIMET's "
          "techniques, HTP config)", {"any": "aimet:aimet_tasks"},
          # 2: qnn_preprocess_model first; a step graph's state pairs share one encoding; 3: under int4 weights, the
          # convolutions the HTP takes at no int4 stay int8 (block_quant.int4_refused)
          {"any": _w("aimet", 3, ("aimet-onnx", "onnxruntime", "onnx", "numpy", "torch"), relocatable=True)}),
    Stage("fp16_lint", "5 fp16 lint: where an fp16 variant's float model cannot be represented in fp16 (build "
          "summary warnings)", {"any": "pipeline:_fp16_lint_tasks"},
          {"any": _w("fp16_lint", 1, ("onnxruntime", "onnx", "numpy"))}),
    Stage("convert", "5 convert (qairt): qnn-onnx-converter per graph and variant -> <graph>.cpp, .bin, _net.json",
          {"qairt": "qairt:convert"},
          {"qairt/model-lib": _q("convert", "convert", 2, ("numpy", "onnx")),
           "qairt/dlc": _q("convert", "dlc_convert", 2, ("numpy", "onnx"))}),
    Stage("model_libs", "5 model libs (qairt): qnn-model-lib-generator -> model_libs/<target>/lib<graph>.so",
          {"qairt": "qairt:model_libs"}, {"qairt/model-lib": _q("model_libs", "model_libs", 1)}),
    Stage("htp_config", "6 HTP config (qairt): htp_backend_extensions.json + htp_config.json per graph and chip",
          {"qairt": "qairt:htp_config"}, {"qairt": _q("htp_config", "htp_config", 1, in_process=True)}),
    Stage("compile", "6 compile: one QNN HTP context binary per graph, variant and chip",
          {"ort-qnn": "pipeline:_compile_tasks", "qairt": "qairt:compile"},
          {"ort-qnn": _w("compile", 2, ("onnxruntime", "onnx"), sdk=True, relocatable=True),
           "qairt": _q("compile", "context_binary", 2)}),
    Stage("check", "7 check: run each binary on the HTP emulator vs the float model; fail below the graph's gate",
          {"ort-qnn": "pipeline:_check_tasks", "qairt": "qairt:check"},
          # 5: early verdicts (a failed gate's report partial after k of N samples), proofs in their own memo, after
          # the reference's check; two zero frames agree in frame_cosine (samples.ZERO_FRAME)
          # qairt 4: other chips proven equal to the reference (equal_to), its key in "inputs"; zero frames
          # 6: a binary that does not repeat itself is measured on each run, fails naming where it starts ("locate")
          {"ort-qnn": _w("check", 6, ("onnxruntime", "numpy"), sdk=True, relocatable=True),
           "qairt": _q("check", "qairt_check", 4, ("numpy", "onnxruntime"))}),
    Stage("evaluate", "7b evaluate: the model's evaluate hook over all graphs (e.g. WER): float on CPU, each binary "
          "on the emulator", {"ort-qnn": "pipeline:_evaluate_tasks"},
          # 3: a chip proven equal to the reference takes its evaluation (equal_to); 4: early verdicts (bound hook)
          {"ort-qnn": _w("evaluate", 4, ("onnxruntime", "numpy"), sdk=True)}),
    # The float model's evaluation (evaluate:<model>/float): the evaluate worker, keyed apart from the binaries' and
    # without the toolchain (the float model runs on the CPU).
    Stage("evaluate_float", "", {}, {"ort-qnn": _w("evaluate", 2, ("onnxruntime", "numpy"), key="evaluate_float")}),
    Stage("package", "8 package: manifest.json per model, variant and chip (SDK identity, hashes, metrics)",
          {"ort-qnn": "pipeline:_package_tasks", "qairt": "qairt:package"},
          # ort-qnn: 4: the check's equal-chip proof and the mostly-float warning in the manifest
          {"ort-qnn": _w("package", 4, sdk=True, in_process=True),
           # qairt 3: the check's equal-chip proof (equal_to / differs_from) per graph
           "qairt": _q("package", "qairt_package", 3, in_process=True)}),
    Stage("report", "9 report: variants x chips per model (size, compile time, emulator metrics) -> "
          "out/<model>/report.md + .png", {"any": "tuning:report_tasks"},
          # 5: cells not measured yet are marked (never measured here); equal-chip cells; model metrics beside float
          # 6: the phones' real-time factor and per-op cycles tables; 7: the figure shows the gated metrics per
          # variant and chip with their thresholds (not SQNR), and the phones' latency, at 1200 x 700; the weights
          # column counts the weights of another type than the variant's (read from the QDQ models)
          # 8: a check stopped early shows its k samples' numbers marked "k of N" and fails only the gates they decide
          # 9: ... each of those numbers marked, the gates they do not decide "not judged, stopped early" (a score
          # hook's metric: why it was not measured); frame_cosine is not a task metric; the float line in view
          # 10: the compiles are its setup tasks: under --continue a cell whose compile (or quantize) failed is shown
          # "not built" with the error, beside the others
          # 11: report.md says to rebuild with `doit report:<model>` (plain `doit report` builds every model)
          {"any": _w("report", 11, ("onnxruntime", "numpy", "matplotlib"), sdk=True)}),
    Stage("sensitivity", "10 sensitivity: rank each graph's activation tensors by what 8 bit costs (HTP emulator) "
          "-> table + plot", {"any": "tuning:sensitivity_tasks"},
          # 3: candidates keep the variant's weight overrides and LPBQ blocks
          # 4: a step graph's state pairs quantized with one encoding, as the build does (state_encodings.py)
          # 5: whether its ends (all 8 / all 16 bit) repeat themselves, marked "unstable" when not
          # 6: candidates quantized as quantize 8 does (element-wise constants)
          {"any": _w("sensitivity", 6, ("onnxruntime", "onnx", "numpy", "matplotlib"), sdk=True)}),
    Stage("tune", "11 tune: fewest 16-bit tensors meeting each graph's target -> "
          "out/<model>/tuning/<variant>.tuned.toml", {"any": "tuning:tune_tasks"},
          # 4: the ladder judges the variant as built, then per-layer weight bits; candidates keep the variant's weights
          # 5: a rung, probe or trial that misses stops early (its numbers stopped_after k of N samples)
          # 6: a step graph's state pairs take one encoding in every candidate, and a 16-bit tensor next to a pair
          # takes the whole pair to 16 bit (what quantize can build)
          # 8: in-process candidates compile blocked weights as the build does; a candidate that does not repeat
          # itself is a miss; all at 16 bit missing does not end the search; the proposal built and measured last
          # (and 8:) the comments give each measurement's target metrics first and the gates it missed ("misses"); a chosen
          # per-layer rung says how many weights its section keeps at int8 before listing the probes
          # 9: the search runs on the CPU, judged with margins from points measured on both; rungs screened on the CPU
          # 11: after the emulator misses the CPU's proposal, groups come back (halving) and a few tries at fewer;
          # a screen rules out with the largest difference seen of either sign; candidates quantized as quantize 8
          {"any": _w("tune", 13, ("onnxruntime", "onnx", "numpy", "aimet-onnx"), sdk=True)}),
    Stage("diagnose", "7c diagnose: where a binary loses accuracy, tensor by tensor (emulator vs CPU QDQ vs float) "
          "-> <graph>.diagnose.md", {"any": "diagnose:diagnose_tasks"},
          # 2: a drop at a layer reading int4 weights proposes the weight_overrides line; the weight type per row;
          # 3: a concatenated tensor slice by slice, a crushed slice named with its overrides (concat_slices.py);
          # a binary that does not repeat itself: where it starts, precisions tried ("instability"); 4: quantized as
          # quantize 8 does (element-wise constants); 5: a fix repeats itself over as many pairs of runs as a check
          # compares (16), not 3 runs of each sample
          {"any": _w("diagnose", 5, ("onnxruntime", "onnx", "numpy", "matplotlib"), sdk=True)}),
    Stage("multi_soc", "12 multi_soc: [dist] multi_soc = true: one Flexible Context Binary per graph for all the "
          "variant's chips", {"any": "dist:multi_soc_tasks"},
          {"any": _w("multi_soc", 1, ("onnxruntime", "onnx"), sdk=True)}),
    Stage("shared_context", "12b shared_context: [model] share_weights: each group's graphs in one context storing "
          "shared weights once", {"ort-qnn": "dist:shared_context_tasks", "qairt": "qairt:shared_context"},
          {"ort-qnn": _w("shared_context", 1, ("onnxruntime", "onnx"), sdk=True),
           "qairt/dlc": _q("shared_context", "qairt_shared_context", 1)}),
    Stage("dist", "13 dist: a device bundle per variant (index, checksums, licences; contract checked) + "
          "reproducible .tar.gz", {"any": "dist:dist_tasks"},
          # 2: index.json says how many samples the contract was checked on (verify); 3: chips.<chip>.equal_to, .warnings
          {"any": _w("dist", 3, ("onnxruntime", "onnx", "numpy"), sdk=True)}),
    # On a phone over adb (not default tasks; docs/device.md): their actions are in build_rules/device/ and run inside
    # doit; each keys itself on the binary, the runtime's identity and the phone's build fingerprint, which needs
    # adb, so doit's own check never calls it (uptodate False) and these versions are the rows' only.
    Stage("device_check", "14 device_check: [devices.<name>] in devices.toml: the binary on the phone's NPU, judged "
          "by the graph's gates", {"any": "device:device_check_tasks"},
          {"any": Worker(module=None, key="device_check", version=2, in_process=True)}),  # 2: frame_cosine's zero frames
    Stage("profile", "14b profile: on the phone, native I/O: cold/warm load, first, min/median/p90/max latency, peak "
          "memory, thermal flags (qnn-profile-viewer)",
          {"any": "device:profile_tasks"}, {"any": Worker(module=None, key="profile", version=2, in_process=True)}),
    Stage("power", "14c power: on the phone: the model in a loop, CPU share and battery drain "
          "(BUILD_RULES_POWER_SECONDS)", {"any": "device:power_tasks"},
          {"any": Worker(module=None, key="power", version=1, in_process=True)}),
)

BY_NAME = {stage.name: stage for stage in STAGES}
# Every worker by the stage name in its key ("check", "qairt-check", "evaluate_float", ...).
BY_KEY = {w.key: w for stage in STAGES for w in stage.workers.values()}
# Task names that are neither models nor chips (a model folder may not take one).
TASK_NAMES = frozenset([*BY_NAME, "tuning"])


def worker(stage: str, toolchain: str, flow: str | None = None) -> Worker | None:
    """The worker of `stage` under a toolchain (and qairt flow): the most specific row wins; None if it has none."""
    workers = BY_NAME[stage].workers
    for where in (f"{toolchain}/{flow}", toolchain, "any"):
        if where in workers:
            return workers[where]
    return None


def generator(stage: str, toolchain: str) -> str | None:
    """"<module>:<function>" of the stage's task generator under a toolchain; None: the stage makes no task there."""
    generators = BY_NAME[stage].generators
    return generators.get(toolchain, generators.get("any"))


def imports_torch(module: str) -> bool:
    """Whether a stage module imports torch (torch is among its tools): the runner forks it from a server that has
    imported torch already (plumbing/fork_server.py), ~1.2 s a stage here."""
    return any(w.module == module and "torch" in w.tools for stage in STAGES for w in stage.workers.values())


def worker_modules() -> set[str]:
    """Every module in build_rules/stages/ that some row runs."""
    return {w.module for stage in STAGES for w in stage.workers.values() if w.module}


def markdown() -> str:
    """docs/stages.md: the table as a reader wants it (`python -m build_rules.stage_table > docs/stages.md`; a test
    checks that the page is this)."""
    lines = ["# The stages", "",
             "Made from `build_rules/stage_table.py` (`python -m build_rules.stage_table > docs/stages.md`), in the "
             "pipeline's order", "(`doit list` sorts the stages by name; each stage's line there starts with its "
             "number here). A task", "`<stage>:<target>` is made by the generator (`build_rules/tasks/<module>.py`) "
             "and runs the worker", "(`build_rules/stages/<module>.py`, its `run(params)`) of its toolchain. Its key "
             "holds the key version, the", "versions of the tools, and for SDK-dependent workers the toolchain "
             "identity; a relocatable worker's outputs are", "cached by content alone; an in-process worker runs "
             "inside doit.", "",
             "| stage | `doit list` | generator | toolchain | worker | key (version) | tools | SDK | relocatable | "
             "in-process |", "|---|---|---|---|---|---|---|---|---|---|"]
    for stage in STAGES:
        generators = ", ".join(f"{g} ({t})" if t != "any" else g for t, g in stage.generators.items()) or \
            "(made by another stage's generator)"
        for i, (where, w) in enumerate(stage.workers.items()):
            first = i == 0
            lines.append("| " + " | ".join([
                f"`{stage.name}`" if first else "", stage.doc if first else "", generators if first else "",
                where, f"`{w.module}`" if w.module else "", f"`{w.key}` ({w.version})",
                ", ".join(w.tools) or "-", "yes" if w.sdk else "", "yes" if w.relocatable else "",
                "yes" if w.in_process else ""]) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")

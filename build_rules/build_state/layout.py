"""Where every output lives under out/. One place, so tasks, stages and tests agree.

out/<model>/float/<graph>.onnx, .sim.onnx, .io.json, .verify.json, .evaluation.npz   (no SDK involved)
out/<model>/calibration/<graph>/input_list.txt + NNNN.<input>.raw               (shared by all variants)
out/<model>/calibration/<graph>/ranges.<method>-<samples>.json   tensor ranges (calibration statistics), per method
out/<model>/<variant>/<graph>.qdq.onnx                                          (per variant, any chip)
out/<model>/<variant>/<chip>/<graph>.bin, <graph>_ctx.onnx, <graph>.compile.json, <graph>.check.json, manifest.json
out/<model>/<variant>/<chip>/<graph>.measure.json, evaluate.measure.json   memos: the last measurement (and a failure)
out/<model>/<variant>/<chip>/<graph>.proof.npz   the reference chip's outputs on the samples other chips prove with
out/<model>/<variant>/<chip>/<graph>.proof.json  another chip's proof (equal outputs or not), keyed by both binaries
out/<model>/report.md, report.png, report.json                                  (`doit report`)
out/<model>/tuning/<variant>/<graph>.sensitivity.json, .md, .png               (`doit sensitivity`)
out/<model>/tuning/<variant>.tuned.toml, .tuned.json                            (`doit tune`)
out/<model>/<variant>/multi_soc/<graph>.bin, <graph>_ctx.onnx, multi_soc.json   ([dist] multi_soc)
out/<model>/dist/<variant>/..., <model>-<variant>.tar.gz                        (`doit dist`, see dist.py)
qairt toolchain (no .qdq.onnx, no _ctx.onnx):
out/<model>/<variant>/<graph>.cpp, <graph>.bin, <graph>_net.json, <graph>.convert.json   (qnn-onnx-converter)
out/<model>/<variant>/model_libs/<target>/lib<graph>.so                        (qnn-model-lib-generator)
out/<model>/<variant>/<chip>/<graph>_config/htp_backend_extensions.json, htp_config.json
out/<model>/<variant>/<chip>/runtime/libQnnHtp.so, libQnnHtpV<arch>Stub.so, libQnnSystem.so, libQnnHtpV<arch>Skel.so
Logs sit beside the outputs, one per stage: <graph>.<stage>.log.
"""
from __future__ import annotations

import functools

OUT = "out"
RESERVED_VARIANT_NAMES = ("float", "calibration", "data", "tuning", "dist")


def model_dir(model: str) -> str:
    return f"{OUT}/{model}"


def float_file(model: str, graph: str, suffix: str) -> str:
    return f"{OUT}/{model}/float/{graph}{suffix}"


def calibration_dir(model: str, graph: str) -> str:
    return f"{OUT}/{model}/calibration/{graph}"


def raw_name(index: int, input_name: str) -> str:
    return f"{index:04d}.{_file_safe(input_name)}.raw"


@functools.cache  # every load names each calibration file (hundreds): the name is made safe once per input
def _file_safe(input_name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in input_name)


def data_dir(model: str) -> str:
    """Inputs a model's prepare_data hook makes (e.g. speech clips); data.json lists them."""
    return f"{OUT}/{model}/data"


def variant_file(model: str, variant: str, graph: str, suffix: str) -> str:
    return f"{OUT}/{model}/{variant}/{graph}{suffix}"


def chip_dir(model: str, variant: str, chip: str) -> str:
    return f"{OUT}/{model}/{variant}/{chip}"


def chip_file(model: str, variant: str, chip: str, name: str) -> str:
    return f"{OUT}/{model}/{variant}/{chip}/{name}"


def memo_file(report: str) -> str:
    """The measurement memo beside a check or evaluate report (not a target): <graph>.check.json ->
    <graph>.measure.json, evaluate.json -> evaluate.measure.json. It keeps the numbers of a failed check or
    evaluation (build_rules/build_state/results.py)."""
    report = str(report)
    if report.endswith(".check.json"):
        return report[:-len(".check.json")] + ".measure.json"
    return report[:-len(".json")] + ".measure.json"


def proof_file(report: str) -> str:
    """The reference chip's outputs on the proof samples, beside its check report (not a target): <graph>.check.json
    -> <graph>.proof.npz. Other chips' checks compare their outputs with these (stages/check.py)."""
    return str(report)[:-len(".check.json")] + ".proof.npz"


def proof_memo(report: str) -> str:
    """Another chip's proof of equal outputs, beside its check report (not a target): <graph>.check.json ->
    <graph>.proof.json, keyed by the two binaries and the samples it compared (stages/check.py)."""
    return str(report)[:-len(".check.json")] + ".proof.json"


def lock_file(memo: str) -> str:
    """The lock that lets one process at a time measure into a memo (build_rules/plumbing/files.exclusive_lock): kept in the
    build state, not beside the outputs."""
    return f"{OUT}/.build-state/locks/{str(memo).replace('/', '%')}.lock"


def model_lib(model: str, variant: str, target: str, graph: str) -> str:
    return f"{OUT}/{model}/{variant}/model_libs/{target}/lib{graph}.so"


def htp_config_dir(model: str, variant: str, chip: str, graph: str) -> str:
    return f"{OUT}/{model}/{variant}/{chip}/{graph}_config"


def runtime_dir(model: str, variant: str, chip: str) -> str:
    return f"{OUT}/{model}/{variant}/{chip}/runtime"


def calibration_ranges(model: str, graph: str, method: str, samples: int) -> str:
    return f"{OUT}/{model}/calibration/{graph}/ranges.{method}-{samples}.json"


def report_file(model: str, suffix: str) -> str:
    return f"{OUT}/{model}/report{suffix}"


def tuning_file(model: str, variant: str, name: str) -> str:
    """out/<model>/tuning/<variant>/<name>, or out/<model>/tuning/<variant><name> when name starts with '.'"""
    return f"{OUT}/{model}/tuning/{variant}{name}" if name.startswith(".") else f"{OUT}/{model}/tuning/{variant}/{name}"


def multi_soc_dir(model: str, variant: str) -> str:
    return f"{OUT}/{model}/{variant}/multi_soc"


def dist_dir(model: str) -> str:
    return f"{OUT}/{model}/dist"

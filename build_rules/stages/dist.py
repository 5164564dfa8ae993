"""Stage 13, dist: per model and variant a bundle a device integrator can use without knowing out/:
out/<model>/dist/<variant>/ (index.json, SHA256SUMS, LICENSES/, <chip>/..., cpu/, runtime/, multi_soc/) and
out/<model>/dist/<model>-<variant>.tar.gz. What a bundle holds and the commands that use it: build_rules/dist.py.

The I/O contract in index.json is read from the built artifacts (ort-qnn: each chip's <graph>_ctx.onnx; qairt: the
package stage's manifest.json), and the finished bundle is verified (checksums, the SoC embedded in each binary,
the contract on the HTP emulator) before anything is published.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from .. import dist
from ..bundles import dist_parts
from ..errors import BuildError


def run(params: dict) -> dict:
    variant, spec = params["variant"], params["spec"]
    bundle = Path(params["outputs"]["dir"])
    try:
        index = _bundle(params, variant, spec, bundle)
        dist.write_sums(bundle)
        samples = params["dist"]["verify_samples"]
        evaluation = {g: Path(files["evaluation"]) for g, files in params["graphs"].items()}
        dist.verify(bundle, evaluation, samples, say=lambda line: print(line, flush=True),
                    steps=dist.VERIFY_STEPS if samples else 0)
    except dist.DistError as e:
        raise BuildError(f"{params['name']}: {e}") from None
    dist.write_tarball(bundle, Path(params["outputs"]["tarball"]), f"{params['model']['name']}-{variant}")
    _drop_removed_variants(params)
    return {variant: {"chips": len(index["chips"]), "files": len(dist.bundle_files(bundle))}}


def _drop_removed_variants(params: dict) -> None:
    """A variant taken out of model.toml must not leave a bundle behind that looks current: remove the bundles
    and tarballs of variants the model no longer has (the names of its variants are in every dist task's key)."""
    folder = Path(params["final_outputs"]["dir"]).parent
    model = params["model"]["name"]
    keep = set(params["variants"])
    for path in folder.glob("*"):
        name = path.name
        if path.is_dir() and (path / "index.json").is_file() and name not in keep:
            shutil.rmtree(path, ignore_errors=True)
        elif name.startswith(f"{model}-") and name.endswith(".tar.gz") and name[len(model) + 1:-7] not in keep:
            path.unlink(missing_ok=True)


def _copy(source: str | Path, target: Path) -> int:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    return target.stat().st_size


def _bundle(params: dict, variant: str, spec: dict, bundle: Path) -> dict:
    toolchain = params["toolchain"]
    chips, contracts = {}, {}
    runtime_files: dict[str, str] = {}  # bundle path -> source, shared by the chips of one arch
    for chip, entry in spec["chips"].items():
        manifest = json.loads(Path(entry["manifest"]).read_text())
        files = {}
        for graph, built in entry["graphs"].items():
            if "parts" in built:  # a split graph: its parts in order, with the contract of each cut
                try:
                    part_files, contract = dist_parts.bundle_parts(bundle, chip, graph, built)
                except dist_parts.PartsError as e:
                    raise dist.DistError(str(e)) from None
                files.update(part_files)
            elif toolchain["name"] == "ort-qnn":
                files[f"{chip}/{graph}.bin"] = _copy(built["binary"], bundle / chip / f"{graph}.bin")
                files[f"{chip}/{graph}_ctx.onnx"] = _copy(built["ctx_model"], bundle / chip / f"{graph}_ctx.onnx")
                contract = dist.contract_from_ctx(built["ctx_model"])
                contract = {"inputs": contract["inputs"], "outputs": contract["outputs"]}
            else:
                files[f"{chip}/{graph}.bin"] = _copy(built["binary"], bundle / chip / f"{graph}.bin")
                contract = dist.contract_from_manifest(entry["manifest"], graph)
            if graph in contracts and contracts[graph][1] != contract:
                raise dist.DistError(f"graph '{graph}' has another I/O contract on {chip} than on "
                                     f"{contracts[graph][0]} ({entry['manifest']}); the bundle would need one per chip")
            contracts.setdefault(graph, (chip, contract))
        arch = entry["chip"]["dsp_arch"]
        chips[chip] = {"name": entry["chip"]["marketing_name"], "soc_model": entry["chip"]["soc_id"],
                       "ro.soc.model": chip, "dsp_arch": arch, "vtcm_mb": entry["chip"]["vtcm_mb"], "files": files,
                       "metrics": {g: manifest["graphs"][g].get("metrics") for g in entry["graphs"]},
                       "gates": {g: manifest["graphs"][g].get("gated", []) for g in entry["graphs"]},
                       "runtime": _runtime(toolchain, arch, entry, runtime_files)}
        from ..device import results as device_results  # issue 29: what the phones measured with these binaries
        device_checks = device_results.bundle_entry(Path(entry["manifest"]).parent, entry["graphs"])
        if device_checks:
            chips[chip]["device_checks"] = device_checks
        float_ops = {g: manifest["graphs"][g]["float_ops"] for g in entry["graphs"]
                     if manifest["graphs"][g].get("float_ops") is not None}
        if float_ops:  # a quantized variant: what its binaries run in float all the same (qnn_graph.py)
            chips[chip]["float_ops"] = float_ops
        proofs = {g: manifest["graphs"][g]["equal_to"] for g in entry["graphs"] if "equal_to" in manifest["graphs"][g]}
        if proofs:  # metrics measured on another chip's binary, whose outputs these equal (stages/check.py)
            chips[chip]["equal_to"] = proofs
        if manifest.get("warnings"):  # e.g. a quantized variant mostly in float, a binary not smaller than fp16's
            chips[chip]["warnings"] = manifest["warnings"]
    for rel, source in sorted(runtime_files.items()):
        _copy(source, bundle / rel)

    model = params["model"]
    # a split graph's entry has its parts and cuts beside the chain's io (dist_parts.chain_entry)
    graphs = {g: contracts[g][1] if "parts" in contracts[g][1] else {"io": contracts[g][1]} for g in params["graphs"]}
    for g, files in params["graphs"].items():
        if files.get("step"):
            outputs_elsewhere = {t["name"]: other for other in graphs if other != g
                                 for t in graphs[other]["io"]["outputs"]}
            graphs[g]["step"] = dist.step_entry(files["step"], graphs[g]["io"], outputs_elsewhere)
    index = {
        "format": dist.FORMAT, "model": model, "variant": {"name": variant, **spec["settings"]},
        "toolchain": {**toolchain, "oldest_device_runtime": _oldest_runtime(toolchain)},
        "conventions": dist.CONVENTIONS, "chips": chips, "graphs": graphs,
        "cpu_fallback": _cpu_fallback(params, bundle), "tarball": f"{model['name']}-{variant}.tar.gz",
        # `python -m build_rules.dist verify` checks the contract on as many samples as this stage did (by default)
        "verify": {"samples": params["dist"]["verify_samples"]},
        "how": {"select": "python -m build_rules.dist select <bundle> --soc-model <QNN soc_model or ro.soc.model>",
                "verify": "python -m build_rules.dist verify <bundle>  (checksums, binary SoCs, I/O contract on the "
                          "x86 HTP emulator)",
                "load": "QNN C API: QnnContext_createFromBinary(<chip>/<graph>.bin) with the chip's runtime "
                        "libraries, I/O as graphs.<graph>.io says"
                        + ("; ONNX Runtime (QNN EP): open <chip>/<graph>_ctx.onnx, which reads <graph>.bin beside "
                           "it and takes float inputs" if toolchain["name"] == "ort-qnn" else "")},
    }
    if spec.get("multi_soc") is not None:
        index["multi_soc"] = _multi_soc(spec["multi_soc"], bundle, chips)
    if spec.get("shared") is not None:  # [model] share_weights
        try:
            index["shared_contexts"] = dist_parts.bundle_shared(bundle, spec["shared"], chips)
        except dist_parts.PartsError as e:
            raise dist.DistError(str(e)) from None
    _licenses(params, bundle, bool(runtime_files))
    (bundle / dist.INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return index


def _runtime(toolchain: dict, arch: str, entry: dict, runtime_files: dict[str, str]) -> dict:
    """The QNN libraries a phone needs beside this chip's binaries: shipped when the toolchain has them (qairt's
    package stage copies them from the SDK), else their exact names and where they come from."""
    upper = arch.upper()
    folders = {"aarch64-android": ["libQnnHtp.so", "libQnnSystem.so", f"libQnnHtp{upper}Stub.so"],
               f"hexagon-{arch}": [f"libQnnHtp{upper}Skel.so"]}
    oldest = _oldest_runtime(toolchain)
    if not entry.get("runtime"):
        return {"shipped": False, "libraries": folders, "minimum_sdk": oldest["qairt"], "minimum_build": oldest["build_id"],
                "where": f"lib/<folder>/ of a QAIRT SDK {oldest['qairt']} or newer (hexagon-{arch}/unsigned/ for "
                         "the Skel); the onnxruntime-qnn wheel has x86_64 libraries only. On the phone: the aarch64 "
                         "libraries beside the app's native libraries, the Skel in a folder on ADSP_LIBRARY_PATH"}
    shipped = {}
    for folder, names in folders.items():
        for name in names:
            if name not in entry["runtime"]:
                raise dist.DistError(f"{entry['manifest']}: the package has no runtime library {name} for {arch}")
            rel = f"runtime/{folder}/{name}"
            source = entry["runtime"][name]
            if rel in runtime_files and dist.sha256(runtime_files[rel]) != dist.sha256(source):
                raise dist.DistError(f"{source} differs from {runtime_files[rel]}: two chips bring another {name}")
            runtime_files[rel] = source
            shipped.setdefault(folder, []).append(rel)
    return {"shipped": True, "libraries": shipped, "minimum_sdk": oldest["qairt"], "minimum_build": oldest["build_id"],
            "where": "runtime/ of this bundle (from the SDK that built the binaries): aarch64-android/ beside the "
                     "app's native libraries, hexagon-<arch>/ in a folder on ADSP_LIBRARY_PATH"}


def _oldest_runtime(toolchain: dict) -> dict:
    """QNN loads a context binary with the runtime of the SDK that made it or a newer one; an older runtime fails
    ("Unsupported context binary version", "Stub lib id mismatch"). The SDK release is the first three parts."""
    version = toolchain.get("qnn_version") or toolchain.get("sdk_version") or ""
    return {"qairt": ".".join(str(version).split(".")[:3]), "build_id": toolchain.get("build_id"),
            "why": "a device runtime (libQnnHtp.so and the Stub/Skel) from this QAIRT release or newer loads these "
                   "binaries; an older one fails (e.g. 'Unsupported context binary version')"}


def _cpu_fallback(params: dict, bundle: Path) -> dict:
    shipped = params["dist"]["cpu_fallback"]
    graphs = {}
    for graph, files in params["graphs"].items():
        if shipped:
            _copy(files["float"], bundle / "cpu" / f"{graph}.onnx")
            graphs[graph] = f"cpu/{graph}.onnx"
        else:
            graphs[graph] = files["float"]
    return {"shipped": shipped, "graphs": graphs,
            "how": "float32 ONNX graphs with the same input and output names, for phones whose SoC has no binary "
                   "here: run them with ONNX Runtime's CPU execution provider (float inputs, no quantization)"}


def _multi_soc(report_path: str | dict, bundle: Path, chips: dict) -> dict:
    if isinstance(report_path, dict):  # not made, and why (from the task: e.g. another toolchain)
        return {"chips": [], "error": report_path["error"], "graphs": {}}
    report = json.loads(Path(report_path).read_text())
    folder = Path(report_path).parent
    entry = {"chips": report["chips"], "error": report.get("error"), "graphs": {}}
    if report.get("error"):
        return entry
    for graph, made in report["graphs"].items():
        for name in (made["binary"], made["ctx_model"]):
            _copy(folder / name, bundle / "multi_soc" / name)
        if dist.sha256(bundle / "multi_soc" / made["binary"]) != made["sha256"]:
            raise dist.DistError(f"{folder / made['binary']} is not the file {report_path} describes")
        per_chip = sum(chips[c]["files"][f"{c}/{graph}.bin"] for c in report["chips"])
        entry["graphs"][graph] = {"binary": f"multi_soc/{made['binary']}", "ctx_model": f"multi_soc/{made['ctx_model']}",
                                  "bytes": made["bytes"], "per_chip_bytes": per_chip, "qnn_graph": made["qnn_graph"],
                                  "records": made["records"], "emulator": made["emulator"]}
    entry["how"] = ("one file per graph for all these chips (onnxruntime-qnn Flexible Context Binary, a DLC with one "
                    "record per SoC): load multi_soc/<graph>_ctx.onnx with ONNX Runtime's QNN EP, which picks the "
                    "phone's record; it is not a plain context binary for the QNN C API")
    return entry


def _licenses(params: dict, bundle: Path, ships_runtime: bool) -> None:
    model, toolchain = params["model"], params["toolchain"]
    folder = bundle / "LICENSES"
    folder.mkdir(parents=True, exist_ok=True)
    text = f"{model['name']}: {model['description'] or model['name']}\nLicense: {model['license']}\n\n"
    if params["dist"].get("license_file"):
        text += Path(params["dist"]["license_file"]).read_text(encoding="utf-8", errors="replace")
    else:
        text += ("model.toml names the licence above; its text is not in this bundle (set [dist] license_file "
                 "in the model's model.toml to ship it).\n")
    (folder / "MODEL.txt").write_text(text)
    sdk = toolchain.get("qnn_version") or toolchain.get("sdk_version")
    made_with = (f"onnxruntime-qnn {toolchain.get('package_version')} (QNN {sdk})" if toolchain["name"] == "ort-qnn"
                 else f"the QAIRT SDK {sdk}")
    runtime = ("runtime/ holds QNN runtime libraries copied from that SDK. They are Qualcomm software under the "
               "SDK's licence terms, which come with the SDK and are not copied here; shipping them in an app is "
               "subject to those terms.\n") if ships_runtime else \
              ("This bundle holds no Qualcomm library. The QNN runtime libraries a phone needs (index.json: chips.*."
               "runtime) are Qualcomm software from the QAIRT SDK under Qualcomm's licence terms (onnxruntime-qnn "
               "ships its x86 QNN libraries with Qualcomm_LICENSE.pdf); shipping them in an app is subject to those "
               "terms.\n")
    (folder / "QNN-RUNTIME.txt").write_text(
        f"The context binaries (*.bin) in this bundle were compiled by {made_with}, build {toolchain.get('build_id')}.\n"
        + runtime)

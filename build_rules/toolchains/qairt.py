"""The "qairt" toolchain: the Qualcomm AI Runtime SDK (QAIRT / QNN SDK) at $QNN_SDK_ROOT, Linux x86_64.

It follows the published sherpa-onnx flow (shared/research/sherpa-qnn.md) step by step:
  qnn-onnx-converter -> <graph>.cpp/.bin/_net.json -> qnn-model-lib-generator -> model_libs/<target>/lib<graph>.so
  -> per chip htp_backend_extensions.json + htp_config.json -> qnn-context-binary-generator -> <chip>/<graph>.bin

This module knows the SDK's layout, its identity (version + HTP build id) and the exact command lines. It is
imported while doit loads the build file, so it uses the standard library only and reads a few small files.
Its command lines are checked against sherpa-onnx's CI and a stand-in SDK (tests/fake_qairt), not a real SDK.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigError
from .qnn_probe import probe_build_id

NAME = "qairt"
HOST = "x86_64-linux-clang"  # the host target: converter, generators, x86 HTP backend (and its emulator)
DEVICE = "aarch64-android"  # the phone target: model libs and runtime libraries
TOOLS = ("qnn-onnx-converter", "qnn-model-lib-generator", "qnn-context-binary-generator")
# Android 15+ needs 16 KB page alignment of native libraries (sherpa-onnx sets this for the lib generator).
LDFLAGS = "-Wl,-z,max-page-size=16384"

_WEIGHT_BITS = {"uint8": 8, "int8": 8, "uint16": 16, "int4": 4}
_SIGNED_WEIGHTS = ("int8", "int4")  # symmetric encodings
_ACT_BITS = {"uint8": 8, "uint16": 16}
# model.toml calibration method -> --act_quantizer_calibration (min-max is the converter's default).
_CALIBRATION = {"minmax": None, "entropy": "entropy", "percentile": "percentile"}
# A source layout that is channel-first is turned channel-last by the converter: QNN-side data must follow.
_TO_CHANNEL_LAST = {"NCF": (0, 2, 1), "NCHW": (0, 2, 3, 1), "NCDHW": (0, 2, 3, 4, 1)}
_DEFAULT_LAYOUT = {3: "NCF", 4: "NCHW", 5: "NCDHW"}  # what the converter assumes for an ONNX input of that rank


class SdkError(ConfigError):
    """$QNN_SDK_ROOT is missing or is not a QAIRT SDK laid out as expected; the message names the file."""


@dataclass(frozen=True)
class Sdk:
    root: Path

    def tool(self, name: str) -> Path:
        return self.root / "bin" / HOST / name

    def host_lib(self, name: str) -> Path:
        return self.root / "lib" / HOST / name

    @property
    def htp_backend(self) -> Path:
        return self.host_lib("libQnnHtp.so")

    @property
    def net_run_extensions(self) -> Path:
        return self.host_lib("libQnnHtpNetRunExtensions.so")

    @property
    def net_run(self) -> Path | None:
        """qnn-net-run, which runs a context binary on the x86 HTP emulator; None when the SDK has none."""
        path = self.tool("qnn-net-run")
        return path if path.is_file() else None

    def runtime_libs(self, dsp_arch: str) -> dict[str, Path]:
        """The device libraries a phone needs next to a context binary for `dsp_arch` ("v79")."""
        arch = dsp_arch.upper()
        device = self.root / "lib" / DEVICE
        return {"libQnnHtp.so": device / "libQnnHtp.so",
                f"libQnnHtp{arch}Stub.so": device / f"libQnnHtp{arch}Stub.so",
                "libQnnSystem.so": device / "libQnnSystem.so",
                f"libQnnHtp{arch}Skel.so": self.root / "lib" / f"hexagon-{dsp_arch}" / "unsigned" / f"libQnnHtp{arch}Skel.so"}

    def version(self) -> tuple[str, str]:
        """(version, where it came from): the `version:` line of sdk.yaml, else the folder name."""
        yaml = self.root / "sdk.yaml"
        if not yaml.exists():
            return self.root.name, "folder name"
        try:
            text = yaml.read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            raise SdkError(f"QAIRT SDK: cannot read {yaml}: {e}") from None
        match = re.search(r"""^version:\s*["']?([0-9][0-9A-Za-z._+-]*)["']?\s*$""", text, re.M)
        if not match:
            raise SdkError(f"QAIRT SDK: {yaml} is malformed: expected a line like 'version: 2.40.0.251030' "
                           f"(QNN_SDK_ROOT={self.root})")
        return match.group(1), "sdk.yaml"


def find_sdk(environ=os.environ) -> Sdk:
    """The SDK at $QNN_SDK_ROOT, checked for every file the build needs (one message lists what is missing)."""
    value = environ.get("QNN_SDK_ROOT")
    if not value:
        raise SdkError("the qairt toolchain needs a QAIRT SDK: set QNN_SDK_ROOT to its folder (e.g. "
                       "qairt/2.40.0.251030, or `source qairt/<version>/bin/envsetup.sh`), or build with "
                       "BUILD_RULES_TOOLCHAIN=ort-qnn")
    sdk = Sdk(Path(value).expanduser().absolute())
    if not sdk.root.is_dir():
        raise SdkError(f"QNN_SDK_ROOT={value}: no such folder (expected an unpacked QAIRT SDK, e.g. "
                       "qairt/2.40.0.251030)")
    needed = [sdk.tool(t) for t in TOOLS] + [sdk.htp_backend, sdk.net_run_extensions]
    missing = [p for p in needed if not p.is_file()]
    if missing:
        listed = ", ".join(str(p.relative_to(sdk.root)) for p in missing)
        raise SdkError(f"QAIRT SDK at QNN_SDK_ROOT={sdk.root} is incomplete: expected {listed} there "
                       f"(a Linux x86_64 QAIRT SDK has them under bin/{HOST}/ and lib/{HOST}/)")
    return sdk


# --------------------------------------------------------------------------------------------------------------
# identity

_memo: dict[tuple, dict] = {}
_lock = threading.Lock()


def identity(sdk: Sdk, cache_dir: Path) -> dict:
    """{"name": "qairt", "sdk_version": ..., "sdk_version_from": ..., "build_id": ...} for task keys.

    The build id comes from the x86 libQnnHtp.so through the QNN C API (qnn_probe), once per library
    (path, size, mtime): the result is cached in `cache_dir`. A library that cannot be probed (the stand-in
    SDK's placeholder) gets build_id None and is named by its xxh3 digest instead, with a note saying so.
    """
    version, source = sdk.version()
    lib = sdk.htp_backend.resolve()
    st = lib.stat()
    key = {"lib": str(lib), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    memo_key = (str(cache_dir), key["lib"], key["size"], key["mtime_ns"])
    with _lock:
        build = _memo.get(memo_key)
        if build is None:
            build = _cached_build(lib, key, Path(cache_dir))
            _memo[memo_key] = build
    return {"name": NAME, "sdk_version": version, "sdk_version_from": source, **build}


def _cached_build(lib: Path, key: dict, cache_dir: Path) -> dict:
    from ..files import atomic_write_json
    from ..hashing import text_digest

    cache_file = cache_dir / f"{NAME}-identity-{text_digest(json.dumps(key, sort_keys=True))[:20]}.json"
    try:
        cached = json.loads(cache_file.read_text(encoding="utf-8"))
        if cached.get("key") == key and "build" in cached:
            return cached["build"]
    except (OSError, ValueError, AttributeError):
        pass  # missing or damaged cache: probe again
    try:
        build = {"build_id": probe_build_id(lib)["build_id"]}
    except (RuntimeError, OSError, ValueError, KeyError) as e:
        from ..hashing import file_digest
        build = {"build_id": None, "htp_library_xxh3": file_digest(lib),
                 "build_id_note": f"{lib.name} gave no build id ({_last_line(str(e)).replace(str(lib), lib.name)}); "
                                  "the library is identified by its digest instead"}
    atomic_write_json(cache_file, {"key": key, "build": build})
    return build


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return (lines[-1] if lines else "no reason given")[:200]


# --------------------------------------------------------------------------------------------------------------
# names and layouts

def qnn_graph_name(graph: str) -> str:
    """The graph name QNN derives from the .cpp basename: '-' (and any other non-identifier char) -> '_'."""
    return re.sub(r"[^A-Za-z0-9_]", "_", graph)


def qnn_permutation(spec: dict) -> tuple[int, ...] | None:
    """Axis order of the QNN-side tensor relative to the ONNX one for an input of this spec (None: same order).

    The converter turns channel-first inputs channel-last; a rank-3 input is taken as NCF unless its
    model.toml `layout` says otherwise (e.g. "NTF" keeps the ONNX order, passed as --input_layout).
    """
    layout = spec.get("layout") or _DEFAULT_LAYOUT.get(len(spec["shape"]))
    return _TO_CHANNEL_LAST.get(layout) if layout else None


# --------------------------------------------------------------------------------------------------------------
# command lines (research/sherpa-qnn.md sections 1.3-1.6)

def converter_command(sdk: Sdk, onnx: str, output_cpp: str, inputs: dict, variant: dict,
                      input_list: str | None = None, overrides: str | None = None) -> list[str]:
    """qnn-onnx-converter: --act_bitwidth/--bias_bitwidth always; quantized iff --input_list is given."""
    fp16 = variant["precision"] == "fp16"
    act_bits = 16 if fp16 else _ACT_BITS[variant["activations"]]
    cmd = [str(sdk.tool("qnn-onnx-converter")), "--input_network", onnx, "--output_path", output_cpp,
           "--act_bitwidth", str(act_bits), "--bias_bitwidth", "32"]
    if fp16:
        cmd += ["--float_bitwidth", "16"]
    else:
        if input_list is None:
            raise ValueError("a quantized variant needs an input list of calibration samples")
        weights = variant["weights"]
        cmd += ["--weights_bitwidth", str(_WEIGHT_BITS[weights])]
        if weights in _SIGNED_WEIGHTS:
            cmd += ["--param_quantizer_schema", "symmetric"]
        if variant.get("per_channel"):
            cmd += ["--use_per_channel_quantization"]
        method = _CALIBRATION[variant.get("calibration_method", "minmax")]
        if method:
            cmd += ["--act_quantizer_calibration", method]
        if overrides:
            cmd += ["--quantization_overrides", overrides]
        cmd += ["--input_list", input_list, "--use_native_input_files"]
    for name, spec in inputs.items():
        cmd += ["--input_dtype", name, spec["dtype"]]
        if spec.get("layout"):
            cmd += ["--input_layout", name, spec["layout"]]
    return cmd


def overrides_json(overrides: dict[str, str]) -> dict:
    """Per-tensor activation types as a --quantization_overrides file (bitwidth-only encodings)."""
    return {"activation_encodings": {t: [{"bitwidth": _ACT_BITS[v], "dtype": "int"}] for t, v in sorted(overrides.items())},
            "param_encodings": {}}


def model_lib_command(sdk: Sdk, cpp: str, bin_: str, output_dir: str, targets: list[str] | None) -> list[str]:
    """qnn-model-lib-generator; no -t builds every default target (x86_64-linux-clang and aarch64-android)."""
    cmd = [str(sdk.tool("qnn-model-lib-generator")), "-c", cpp, "-b", bin_, "-o", output_dir]
    if targets:
        cmd += ["-t", *targets]
    return cmd


def ndk_build() -> str | None:
    """ndk-build on PATH: needed for the aarch64-android model libs."""
    return shutil.which("ndk-build")


def htp_config_files(sdk: Sdk, graph_name: str, chip: dict, config_path_abs: str) -> tuple[dict, dict]:
    """(htp_backend_extensions.json, htp_config.json) exactly as sherpa-onnx's generate_config.py writes them."""
    extensions = {"backend_extensions": {"shared_library_path": str(sdk.net_run_extensions),
                                         "config_file_path": config_path_abs}}
    config = {"graphs": [{"vtcm_mb": chip["vtcm_mb"], "O": 3, "graph_names": [graph_name]}],
              "devices": [{"device_id": 0, "soc_id": chip["soc_id"], "dsp_arch": chip["dsp_arch"],
                           "cores": [{"core_id": 0, "perf_profile": "burst", "rpc_control_latency": 200}]}]}
    return extensions, config


def context_binary_command(sdk: Sdk, model_lib: str, output_dir: str, binary_file: str, config_file: str) -> list[str]:
    return [str(sdk.tool("qnn-context-binary-generator")), "--backend", str(sdk.htp_backend), "--model", model_lib,
            "--output_dir", output_dir, "--binary_file", binary_file, "--config_file", config_file]


def net_run_command(sdk: Sdk, binary: str, input_list: str, output_dir: str) -> list[str]:
    """qnn-net-run on the x86 HTP backend (the emulator): float raw inputs in, float raw outputs out."""
    return [str(sdk.net_run or sdk.tool("qnn-net-run")), "--backend", str(sdk.htp_backend),
            "--retrieve_context", binary, "--input_list", input_list, "--output_dir", output_dir]


# --------------------------------------------------------------------------------------------------------------
# converter log

_UNSUPPORTED = [
    re.compile(r"no translation registered for op type\s+['\"]?(?:onnx_)?([A-Za-z0-9_]+)", re.I),
    re.compile(r"unsupported (?:op|operation|operator|layer)(?: type)?\s*[:=]?\s*['\"]?([A-Za-z0-9_]+)", re.I),
    re.compile(r"(?:op|operation|operator)(?: type)?\s+['\"]?([A-Za-z0-9_]+)['\"]?\s+(?:is\s+)?not supported", re.I),
]
_CPU = re.compile(r"(fall(?:s|ing)? ?back to (?:the )?cpu|will (?:run|be executed) on (?:the )?cpu|cpu fallback)", re.I)
_QUANT_WARNING = re.compile(r"warn.*(quantiz|encoding|calibrat|bitwidth|overflow|clip)", re.I)


def scan_converter_log(text: str) -> dict:
    """Problems the converter reported: {"unsupported_ops": [...], "cpu_ops": [lines], "quantization_warnings": [...]}."""
    unsupported: list[str] = []
    cpu: list[str] = []
    warnings: list[str] = []
    for line in text.splitlines():
        for pattern in _UNSUPPORTED:
            match = pattern.search(line)
            if match and match.group(1) not in unsupported:
                unsupported.append(match.group(1))
                break
        if _CPU.search(line):
            cpu.append(line.strip())
        elif _QUANT_WARNING.search(line):
            warnings.append(line.strip())
    return {"unsupported_ops": unsupported, "cpu_ops": cpu, "quantization_warnings": warnings}

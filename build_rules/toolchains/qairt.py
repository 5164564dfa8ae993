"""The "qairt" toolchain: the Qualcomm AI Runtime SDK (QAIRT / QNN SDK) at $QNN_SDK_ROOT, Linux x86_64.

Two flows, chosen by `qairt_flow` at the top of chips.toml or $BUILD_RULES_QAIRT_FLOW (per run):
  "model-lib" (default, the seeds' and sherpa-onnx's flow, shared/research/sherpa-qnn.md):
      qnn-onnx-converter -> <graph>.cpp/.bin/_net.json -> qnn-model-lib-generator -> model_libs/<target>/lib<graph>.so
      -> per chip htp_backend_extensions.json + htp_config.json -> qnn-context-binary-generator --model lib<graph>.so
  "dlc": qairt-converter -> <graph>.dlc -> qairt-quantizer -> <graph>.dlc (quantized)
      -> per chip the same HTP config -> qnn-context-binary-generator --dlc_path <graph>.dlc --model libQnnModelDlc.so
      (no model libraries, so no clang++, make or NDK; the converter keeps the ONNX layout of every input)

This module knows the SDK's layout, its identity (version, build id, HTP backend build id), the environment its
tools need and the exact command lines. It is imported while doit loads the build file, so it uses the standard
library only and reads a few small files. The command lines follow sherpa-onnx's CI, Qualcomm's QAIRT docs and
the tools' published --help texts (docs/qairt.md says which flag comes from where); they have not met a real SDK.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from ..configuration.config import QAIRT_FLOWS, ConfigError
from ..quantization.dtypes import TYPES
from ..errors import BuildError, did_you_mean
from .qnn_probe import probe_build_id

NAME = "qairt"
HOST = "x86_64-linux-clang"  # the host target: converter, generators, x86 HTP backend (and its emulator)
DEVICE = "aarch64-android"  # the phone target: model libs and runtime libraries
FLOWS = QAIRT_FLOWS  # ("model-lib", "dlc"): chips.toml accepts the same
FLOW_ENV = "BUILD_RULES_QAIRT_FLOW"
# Files every flow needs, then each flow's own (bin/ tools, lib/ libraries, all under the host target).
COMMON_TOOLS = ("qnn-context-binary-generator",)
COMMON_LIBS = ("libQnnHtp.so", "libQnnHtpNetRunExtensions.so")
FLOW_TOOLS = {"model-lib": ("qnn-onnx-converter", "qnn-model-lib-generator"),
              # qnn-context-binary-utility reads a binary's I/O back: the DLC flow has no _net.json.
              "dlc": ("qairt-converter", "qairt-quantizer", "qnn-context-binary-utility")}
FLOW_LIBS = {"model-lib": (), "dlc": ("libQnnModelDlc.so",)}
# Programs qnn-model-lib-generator runs to build the x86_64-linux-clang model library (the generator prefers
# clang++-9, research/qairt-audit.md #8); the aarch64-android library needs ndk-build instead.
HOST_BUILD_PROGRAMS = {"clang++": ("clang++", "clang++-9"), "make": ("make",)}
# Android 15+ needs 16 KB page alignment of native libraries (sherpa-onnx sets this for the lib generator).
LDFLAGS = "-Wl,-z,max-page-size=16384"

_WEIGHT_BITS = {t.name: t.bits for t in TYPES if t.weight}  # dtypes.py: the quantized types
# Symmetric weight encodings: signed weights, and 16-bit weights, whose --restrict_quantization_steps only
# applies with a symmetric parameter quantizer (the quantizer says "Value will be ignored" otherwise).
_SYMMETRIC_WEIGHTS = tuple(t.name for t in TYPES if t.weight and t.qairt_symmetric)
# "This argument is required for 16-bit Matmul operations" (qairt-quantizer --help); one argv entry, two hex.
_RESTRICT_STEPS_16 = "-0x8000 0x7F7F"
_ACT_BITS = {t.name: t.bits for t in TYPES if t.activation}
# HTP v68/v69 have no 16-bit MatMul without per-row quantization (`expected >= 73 ... 0xc26`, audit #3).
PER_ROW_ARCHS = ("v68", "v69")
# model.toml calibration method -> --act_quantizer_calibration (min-max is the converter's default).
_CALIBRATION = {"minmax": None, "entropy": "entropy", "percentile": "percentile"}
# A source layout that is channel-first is turned channel-last by qnn-onnx-converter: QNN-side data must follow.
TO_CHANNEL_LAST = {"NCF": (0, 2, 1), "NCHW": (0, 2, 3, 1), "NCDHW": (0, 2, 3, 4, 1)}
_DEFAULT_LAYOUT = {3: "NCF", 4: "NCHW", 5: "NCDHW"}  # what qnn-onnx-converter assumes for an ONNX input of that rank


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
    def model_dlc_lib(self) -> Path:
        """The model library qnn-context-binary-generator loads to compose graphs from a DLC."""
        return self.host_lib("libQnnModelDlc.so")

    @property
    def python_dir(self) -> Path:
        """lib/python: the converters and the quantizer import qti.aisw from here."""
        return self.root / "lib" / "python"

    @property
    def net_run(self) -> Path | None:
        """qnn-net-run, which runs a context binary on the x86 HTP emulator; None when the SDK has none."""
        path = self.tool("qnn-net-run")
        return path if path.is_file() else None

    def runtime_libs(self, dsp_arch: str) -> dict[str, Path]:
        """The device libraries a phone needs next to a context binary for `dsp_arch` ("v79"), and no more.

        Not libQnnHtpPrepare.so (~85 MB): it prepares graphs on the device (from a model library or a DLC);
        a context binary is prepared already. Only this arch's Stub and Skel: a binary runs on one arch.
        """
        arch = dsp_arch.upper()
        device = self.root / "lib" / DEVICE
        return {"libQnnHtp.so": device / "libQnnHtp.so",
                f"libQnnHtp{arch}Stub.so": device / f"libQnnHtp{arch}Stub.so",
                "libQnnSystem.so": device / "libQnnSystem.so",
                f"libQnnHtp{arch}Skel.so": self.root / "lib" / f"hexagon-{dsp_arch}" / "unsigned" / f"libQnnHtp{arch}Skel.so"}

    def release(self) -> tuple[str, str | None, str]:
        """(version, build id, where they came from).

        A real sdk.yaml has `version: 2.40.0` and `build_id: 251030` on separate lines; the SDK's folder is
        named `2.40.0.251030` after both. Without sdk.yaml the folder name is read the same way.
        """
        yaml = self.root / "sdk.yaml"
        if not yaml.exists():
            match = re.fullmatch(r"v?(\d+\.\d+\.\d+)(?:\.(\d+))?", self.root.name)
            return (match.group(1), match.group(2), "folder name") if match else (self.root.name, None, "folder name")
        try:
            text = yaml.read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            raise SdkError(f"QAIRT SDK: cannot read {yaml}: {e}") from None
        version = _yaml_value(text, "version")
        if not version or not re.fullmatch(r"\d+\.\d+\.\d+(\.\d+)?", version):
            raise SdkError(f"QAIRT SDK: {yaml} is malformed: expected a line like 'version: 2.40.0' "
                           f"(and 'build_id: 251030'; QNN_SDK_ROOT={self.root})")
        build_id = _yaml_value(text, "build_id")
        if version.count(".") == 3:  # an all-in-one version string: its last part is the build id
            version, _, from_version = version.rpartition(".")
            build_id = build_id or from_version
        return version, build_id, "sdk.yaml"


def _yaml_value(text: str, key: str) -> str | None:
    match = re.search(rf"""^{key}:\s*["']?([0-9A-Za-z._+-]+)["']?\s*$""", text, re.M)
    return match.group(1) if match else None


def choose_flow(repo_flow: str = "model-lib", environ=os.environ) -> str:
    """The QAIRT flow of this run: $BUILD_RULES_QAIRT_FLOW, else chips.toml's qairt_flow (default model-lib)."""
    asked = environ.get(FLOW_ENV, "").strip()
    if asked and asked not in FLOWS:
        raise ConfigError(f"{FLOW_ENV}={asked}: unknown QAIRT flow (choose one of {', '.join(FLOWS)})")
    return asked or repo_flow


def find_sdk(environ=os.environ, flow: str | None = None) -> Sdk:
    """The SDK at $QNN_SDK_ROOT, checked for every file the build needs (one message lists what is missing).

    With `flow`, also that flow's tools and, for the model-lib flow, the host programs the model-library build
    runs: a build that would fail there fails here, while doit loads, before any tool has run.
    """
    value = environ.get("QNN_SDK_ROOT")
    if not value:
        raise SdkError("the qairt toolchain needs a QAIRT SDK: set QNN_SDK_ROOT to its folder (e.g. "
                       "qairt/2.40.0.251030), or build with BUILD_RULES_TOOLCHAIN=ort-qnn")
    sdk = Sdk(Path(value).expanduser().absolute())
    if not sdk.root.is_dir():
        raise SdkError(f"QNN_SDK_ROOT={value}: no such folder (expected an unpacked QAIRT SDK, e.g. "
                       "qairt/2.40.0.251030)")
    needed = [sdk.tool(t) for t in COMMON_TOOLS] + [sdk.host_lib(lib) for lib in COMMON_LIBS]
    missing = [p for p in needed if not p.is_file()]
    if missing:
        raise SdkError(f"QAIRT SDK at QNN_SDK_ROOT={sdk.root} is incomplete: expected {_listed(sdk, missing)} there "
                       f"(a Linux x86_64 QAIRT SDK has them under bin/{HOST}/ and lib/{HOST}/)")
    if flow is None:
        return sdk
    missing = [p for p in [sdk.tool(t) for t in FLOW_TOOLS[flow]] + [sdk.host_lib(lib) for lib in FLOW_LIBS[flow]]
               if not p.is_file()]
    if missing and flow == "dlc":
        version, build_id, _ = sdk.release()
        raise SdkError(f"QAIRT SDK {version} at QNN_SDK_ROOT={sdk.root} has no {_listed(sdk, missing)}: the DLC flow "
                       "needs qairt-converter, qairt-quantizer and libQnnModelDlc.so (qairt-converter came with QAIRT "
                       "2.21): use a newer SDK, or the model-lib flow (qairt_flow = \"model-lib\" in chips.toml, "
                       f"or {FLOW_ENV}=model-lib)")
    if missing:
        raise SdkError(f"QAIRT SDK at QNN_SDK_ROOT={sdk.root} is incomplete: expected {_listed(sdk, missing)} there "
                       f"(the model-lib flow's tools; or use the DLC flow: {FLOW_ENV}=dlc)")
    if flow == "model-lib":
        absent = missing_build_programs(environ.get("PATH"))
        if absent:
            raise SdkError(f"qairt model-lib flow: no {' or '.join(absent)} on PATH: qnn-model-lib-generator builds "
                           f"the {HOST} model library with clang++ and make; install them (Debian/Ubuntu: apt-get "
                           "install clang make), or use the DLC flow, which needs neither (qairt_flow = \"dlc\" in "
                           f"chips.toml, or {FLOW_ENV}=dlc)")
    return sdk


def _listed(sdk: Sdk, paths: list[Path]) -> str:
    return ", ".join(str(p.relative_to(sdk.root)) for p in paths)


def missing_build_programs(path: str | None = None) -> list[str]:
    """The programs the x86_64-linux-clang model-library build needs that are not on `path` (default $PATH)."""
    return [name for name, accepted in HOST_BUILD_PROGRAMS.items()
            if not any(shutil.which(p, path=path) for p in accepted)]


def ndk_build() -> str | None:
    """ndk-build on PATH: needed for the aarch64-android model libs."""
    return shutil.which("ndk-build")


def tool_env(sdk: Sdk, base=os.environ) -> dict[str, str]:
    """The environment every SDK tool runs in, made from QNN_SDK_ROOT alone (what bin/envsetup.sh would set):
    the converters import qti.aisw from lib/python, libQnnHtp.so loads libQnnHtpPrepare.so by name from
    LD_LIBRARY_PATH, and the tools call each other through PATH."""
    env = dict(base)

    def prepend(name: str, folder: Path) -> None:
        env[name] = os.pathsep.join([str(folder)] + ([env[name]] if env.get(name) else []))

    env["QNN_SDK_ROOT"] = str(sdk.root)
    prepend("PYTHONPATH", sdk.python_dir)
    prepend("LD_LIBRARY_PATH", sdk.root / "lib" / HOST)
    prepend("PATH", sdk.root / "bin" / HOST)
    return env


# --------------------------------------------------------------------------------------------------------------
# identity

_memo: dict[tuple, dict] = {}
_lock = threading.Lock()


def identity(sdk: Sdk, cache_dir: Path, flow: str = "model-lib") -> dict:
    """What the qairt toolchain's outputs depend on, for task keys and manifests:
    {"name": "qairt", "sdk_version": "2.40.0", "sdk_build_id": "251030", "sdk_version_from": "sdk.yaml",
     "flow": "model-lib", "build_id": <HTP backend build id>, ...}.

    The flow is part of it because the two flows run different tools on every SDK stage. The HTP backend's build
    id comes from the x86 libQnnHtp.so through the QNN C API (qnn_probe), once per library (path, size, mtime):
    the result is cached in `cache_dir`. A library that cannot be probed (the stand-in SDK's placeholder) gets
    build_id None and is named by its xxh3 digest instead, with a note saying so.
    """
    version, build_id, source = sdk.release()
    lib = sdk.htp_backend.resolve()
    st = lib.stat()
    key = {"lib": str(lib), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    memo_key = (str(cache_dir), key["lib"], key["size"], key["mtime_ns"])
    with _lock:
        build = _memo.get(memo_key)
        if build is None:
            build = _cached_build(lib, key, Path(cache_dir))
            _memo[memo_key] = build
    return {"name": NAME, "sdk_version": version, "sdk_build_id": build_id, "sdk_version_from": source,
            "flow": flow, **build}


def release_name(ident: dict) -> str:
    """'2.40.0.251030': the SDK's version and build id as its folder and download are named."""
    return ".".join(p for p in (ident["sdk_version"], ident.get("sdk_build_id")) if p)


def _cached_build(lib: Path, key: dict, cache_dir: Path) -> dict:
    from ..plumbing.files import atomic_write_json
    from ..build_state.hashing import text_digest

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
        from ..build_state.hashing import file_digest
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
    """The graph name QNN derives from the .cpp (or .dlc) basename: '-' (and any other non-identifier) -> '_'."""
    return re.sub(r"[^A-Za-z0-9_]", "_", graph)


def qnn_tensor_name(name: str) -> str:
    """A tensor name as qnn-onnx-converter writes it into the .cpp: non-identifiers -> '_', no leading digit."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return f"_{name}" if name[:1].isdigit() else name


def qnn_permutation(spec: dict, flow: str = "model-lib") -> tuple[int, ...] | None:
    """Axis order of the QNN-side tensor relative to the ONNX one for an input of this spec (None: same order).

    qnn-onnx-converter turns channel-first inputs channel-last; a rank-3 input is taken as NCF unless its
    model.toml `layout` says otherwise (e.g. "NTF" keeps the ONNX order, passed as --input_layout).
    qairt-converter (the DLC flow) keeps the source layout of every input.
    """
    if flow == "dlc":
        return None
    layout = spec.get("layout") or _DEFAULT_LAYOUT.get(len(spec["shape"]))
    return TO_CHANNEL_LAST.get(layout) if layout else None


def uses_16bit_activations(variant: dict) -> bool:
    return variant.get("activations") == "uint16" or "uint16" in (variant.get("overrides") or {}).values()


def needs_per_row(variant: dict, dsp_archs) -> bool:
    """Per-row quantization of MatMul/FullyConnected weights, for 16-bit activations on a v68/v69 chip among the
    variant's chips (the conversion is shared by all of them, so they all get it)."""
    return variant["precision"] != "fp16" and uses_16bit_activations(variant) and \
        any(arch in PER_ROW_ARCHS for arch in dsp_archs)


# --------------------------------------------------------------------------------------------------------------
# command lines (research/sherpa-qnn.md sections 1.3-1.6; docs/qairt.md for the DLC flow's sources)

def quantization_flags(variant: dict, per_row: bool = False) -> list[str]:
    """The quantizer flags qnn-onnx-converter and qairt-quantizer share: bit widths, schema, granularity."""
    weights = variant["weights"]
    weight_bits = _WEIGHT_BITS[weights]
    flags = ["--act_bitwidth", str(_ACT_BITS[variant["activations"]]), "--bias_bitwidth", "32",
             "--weights_bitwidth", str(weight_bits)]
    if weights in _SYMMETRIC_WEIGHTS:
        flags += ["--param_quantizer_schema", "symmetric"]
    if variant.get("per_channel"):
        flags += ["--use_per_channel_quantization"]
    if per_row:
        flags += ["--use_per_row_quantization"]
    if weight_bits == 16:
        flags += ["--restrict_quantization_steps", _RESTRICT_STEPS_16]
    method = _CALIBRATION[variant.get("calibration_method", "minmax")]
    if method:
        flags += ["--act_quantizer_calibration", method]
    return flags


def converter_command(sdk: Sdk, onnx: str, output_cpp: str, inputs: dict, variant: dict,
                      input_list: str | None = None, overrides: str | None = None, per_row: bool = False) -> list[str]:
    """qnn-onnx-converter (model-lib flow): quantized iff --input_list is given, as in sherpa-onnx."""
    fp16 = variant["precision"] == "fp16"
    cmd = [str(sdk.tool("qnn-onnx-converter")), "--input_network", onnx, "--output_path", output_cpp]
    if fp16:
        cmd += ["--act_bitwidth", "16", "--bias_bitwidth", "32", "--float_bitwidth", "16"]
    else:
        if input_list is None:
            raise ValueError("a quantized variant needs an input list of calibration samples")
        cmd += quantization_flags(variant, per_row)
        if overrides:
            cmd += ["--quantization_overrides", overrides]
        cmd += ["--input_list", input_list, "--use_native_input_files"]
    for name, spec in inputs.items():
        cmd += ["--input_dtype", name, spec["dtype"]]
        if spec.get("layout"):
            cmd += ["--input_layout", name, spec["layout"]]
    return cmd


def dlc_converter_command(sdk: Sdk, onnx: str, output_dlc: str, inputs: dict, variant: dict,
                          overrides: str | None = None) -> list[str]:
    """qairt-converter (DLC flow): a float DLC (fp16 with --float_bitwidth 16); it quantizes nothing itself.
    No layout flags: it keeps the source layout of every input."""
    cmd = [str(sdk.tool("qairt-converter")), "--input_network", onnx, "--output_path", output_dlc]
    if variant["precision"] == "fp16":
        cmd += ["--float_bitwidth", "16"]
    elif overrides:
        cmd += ["--quantization_overrides", overrides]
    for name, spec in inputs.items():
        cmd += ["--source_model_input_datatype", name, spec["dtype"]]
    return cmd


def dlc_quantizer_command(sdk: Sdk, input_dlc: str, output_dlc: str, input_list: str, variant: dict,
                          per_row: bool = False) -> list[str]:
    """qairt-quantizer: calibrates the float DLC with the shared calibration samples (native raw files)."""
    return [str(sdk.tool("qairt-quantizer")), "--input_dlc", input_dlc, "--input_list", input_list,
            "--output_dlc", output_dlc, *quantization_flags(variant, per_row), "--use_native_input_files"]


def tensor_overrides(onnx_path: str, variant: dict, where: str, model=None) -> dict[str, str]:
    """One graph's activation overrides by tensor: `overrides` as they are, each `node_overrides` node's outputs
    (QAIRT's override file names tensors only); a name the float model does not have fails with the closest one.
    model: the loaded model of onnx_path as the quantizer sees it, if not the file itself (the aimet stage's)."""
    import onnx
    if model is None:
        model = onnx.load(onnx_path, load_external_data=False)
    tensors = {t for n in model.graph.node for t in n.output} | {i.name for i in model.graph.input}
    producers = {n.name: [t for t in n.output if t] for n in model.graph.node if n.name}
    result = {}

    def unknown(kind: str, name: str, known) -> BuildError:
        return BuildError(f"{where}: quantization override names unknown {kind} {name!r}: {onnx_path} has no such "
                          f"{kind}{did_you_mean(name, known)}")
    for node, qtype in (variant.get("node_overrides") or {}).items():
        if node not in producers:
            raise unknown("node", node, producers)
        for tensor in producers[node]:
            result[tensor] = qtype
    for tensor, qtype in (variant.get("overrides") or {}).items():
        if tensor not in tensors:
            raise unknown("tensor", tensor, tensors)
        result[tensor] = qtype  # a tensor's own entry wins over its node's
    return result


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


def htp_config_files(sdk: Sdk, graph_name: str, chip: dict, config_path_abs: str) -> tuple[dict, dict]:
    """(htp_backend_extensions.json, htp_config.json) exactly as sherpa-onnx's generate_config.py writes them."""
    extensions = {"backend_extensions": {"shared_library_path": str(sdk.net_run_extensions),
                                         "config_file_path": config_path_abs}}
    config = {"graphs": [{"vtcm_mb": chip["vtcm_mb"], "O": 3, "graph_names": [graph_name]}],
              "devices": [{"device_id": 0, "soc_id": chip["soc_id"], "dsp_arch": chip["dsp_arch"],
                           "cores": [{"core_id": 0, "perf_profile": "burst", "rpc_control_latency": 200}]}]}
    return extensions, config


def shared_htp_config_files(sdk: Sdk, graph_names: list[str], chip: dict, config_path_abs: str) -> tuple[dict, dict]:
    """The HTP config of a weight-shared context: every graph of the group under graph_names, and the context's
    weight_sharing_enabled (QAIRT's HTP backend config; Qualcomm's LLM bundles write it this way)."""
    extensions, config = htp_config_files(sdk, graph_names[0], chip, config_path_abs)
    config["graphs"][0]["graph_names"] = list(graph_names)
    config["context"] = {"weight_sharing_enabled": True}
    return extensions, config


def context_binary_command(sdk: Sdk, output_dir: str, binary_file: str, config_file: str,
                           model_lib: str | None = None, dlc: str | list[str] | None = None) -> list[str]:
    """qnn-context-binary-generator from a model library (model-lib flow) or a DLC (--dlc_path + libQnnModelDlc);
    several DLCs (a comma-separated --dlc_path) make one context holding all their graphs."""
    dlc = ",".join(dlc) if isinstance(dlc, list) else dlc
    model = ["--model", model_lib] if dlc is None else ["--model", str(sdk.model_dlc_lib), "--dlc_path", dlc]
    return [str(sdk.tool("qnn-context-binary-generator")), "--backend", str(sdk.htp_backend), *model,
            "--output_dir", output_dir, "--binary_file", binary_file, "--config_file", config_file]


def binary_info_command(sdk: Sdk, binary: str, json_file: str) -> list[str]:
    """qnn-context-binary-utility: the graphs, tensors, data types and encodings a context binary holds, as JSON."""
    return [str(sdk.tool("qnn-context-binary-utility")), "--context_binary", binary, "--json_file", json_file]


def net_run_command(sdk: Sdk, binary: str, input_list: str, output_dir: str) -> list[str]:
    """qnn-net-run on the x86 HTP backend (the emulator): float raw inputs in, float raw outputs out."""
    return [str(sdk.net_run or sdk.tool("qnn-net-run")), "--backend", str(sdk.htp_backend),
            "--retrieve_context", binary, "--input_list", input_list, "--output_dir", output_dir]


def notes(ident: dict) -> list[str]:
    """What the user should know about a qairt build (shown under the build summary); ident: the toolchain
    identity (its flow, build id)."""
    found = []
    try:
        sdk = find_sdk()
    except SdkError:
        return found
    if ident["flow"] == "model-lib" and not ndk_build():
        found.append("qairt: no ndk-build on PATH, so model libs were built for x86_64-linux-clang only "
                     "(no aarch64-android lib<graph>.so); put the Android NDK on PATH to build them")
    if sdk.net_run is None:
        found.append(f"qairt: check did not run the binaries: no {sdk.tool('qnn-net-run')} "
                     "(check.json and manifest.json say \"not run\")")
    if ident.get("build_id") is None:
        found.append(f"qairt: {ident.get('build_id_note', 'no HTP build id')}")
    return found

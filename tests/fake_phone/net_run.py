"""Stand-in for the QAIRT SDK's bin/aarch64-android/qnn-net-run, run by the fake adb's shell "on the phone".

Flags as the QNN docs' qnn-net-run usage lists them (a subset; an unknown flag fails, like the real tool's parser):
--backend FILE and --input_list FILE required; exactly one of --model / --retrieve_context; --debug not with
--retrieve_context; --perf_profile, --profiling_level from the documented values; --output_dir (default ./output),
--num_inferences, --duration, --keep_num_outputs, --use_native_input_files, --use_native_output_files,
--system_library, --config_file, --log_level. What the real one needs from the phone: libQnnSystem.so and the chip's
libQnnHtpV<arch>Stub.so on LD_LIBRARY_PATH, libQnnHtpV<arch>Skel.so in a folder of ADSP_LIBRARY_PATH (';'-separated),
a binary compiled for the phone's Hexagon arch. It then runs the binary on the x86 HTP emulator (onnxruntime-qnn):
float32 raw inputs quantized with the binary's encodings, float32 outputs Result_<n>/<tensor>.raw dequantized (the
real tool's defaults). The binary's I/O contract, which the real tool reads from the binary with libQnnSystem, is
read from the <graph>_ctx.onnx beside the identical .bin in the host repo (phone.json host_repo): the stand-in's only
knowledge from outside the phone. With --profiling_level it writes <output_dir>/qnn-profiling-data_0.log (a stand-in
format: JSON lines, read by profile_viewer.py), timed on this x86 machine.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

PERF_PROFILES = ("low_balanced", "balanced", "default", "high_performance", "sustained_high_performance", "burst",
                 "low_power_saver", "power_saver", "high_power_saver", "extreme_power_saver", "system_settings")


class Fail(Exception):
    pass


def _phone() -> tuple[dict, Path, str]:
    folder = os.environ.get("FAKE_PHONE_DIR")
    if not folder:  # an aarch64 executable on this x86 host
        raise Fail("cannot execute binary file: Exec format error (qnn-net-run from bin/aarch64-android runs on the "
                   "phone: adb push it and run it with adb shell)")
    return json.loads(Path(folder, "phone.json").read_text()), Path(folder) / "fs", os.environ["FAKE_PHONE_CWD"]


def _host(fs: Path, cwd: str, path: str) -> Path:
    path = path if path.startswith("/") else f"{cwd.rstrip('/')}/{path}"
    return fs / os.path.normpath(path).lstrip("/")


def _find(fs: Path, folders: list[str], name: str) -> bool:
    return any(_host(fs, "/", f"{d}/{name}").is_file() for d in folders if d)


def _contract(binary: Path, host_repo: Path):
    digest = hashlib.sha256(binary.read_bytes()).hexdigest()
    for candidate in (host_repo / "out").rglob("*.bin"):
        ctx = candidate.with_name(candidate.stem + "_ctx.onnx")
        if ctx.is_file() and candidate.stat().st_size == binary.stat().st_size and \
                hashlib.sha256(candidate.read_bytes()).hexdigest() == digest:
            return ctx
    raise Fail(f"[ ERROR ] stand-in: no <graph>_ctx.onnx beside a .bin identical to {binary.name} under "
               f"{host_repo}/out (the stand-in reads the binary's I/O contract from there)")


def main(argv: list[str]) -> int:
    try:
        return _main(argv)
    except Fail as e:
        print(e, file=sys.stderr)
        return 1


def _main(argv: list[str]) -> int:
    phone, fs, cwd = _phone()
    p = argparse.ArgumentParser(prog="qnn-net-run", allow_abbrev=False)
    p.add_argument("--backend", required=True)
    p.add_argument("--input_list", required=True)
    p.add_argument("--model")
    p.add_argument("--retrieve_context")
    p.add_argument("--output_dir", default="./output")
    p.add_argument("--debug", action="store_true")
    p.add_argument("--perf_profile", choices=PERF_PROFILES)
    p.add_argument("--profiling_level", choices=("basic", "detailed", "client", "backend"))
    p.add_argument("--num_inferences", type=int)
    p.add_argument("--duration", type=float)
    p.add_argument("--keep_num_outputs", type=int)
    p.add_argument("--use_native_input_files", action="store_true")
    p.add_argument("--use_native_output_files", action="store_true")
    p.add_argument("--system_library")
    p.add_argument("--config_file")
    p.add_argument("--log_level", choices=("error", "warn", "info", "verbose", "debug"))
    args = p.parse_args(argv)
    if bool(args.model) == bool(args.retrieve_context):
        raise Fail("ERROR: one of --model and --retrieve_context is required; they are mutually exclusive")
    if args.debug and args.retrieve_context:
        raise Fail("ERROR: --debug can not be used when loading a saved context through --retrieve_context")
    if args.num_inferences is not None and args.duration is not None:
        raise Fail("ERROR: --num_inferences and --duration are mutually exclusive")
    arch = phone["arch"].upper()
    libraries = os.environ.get("LD_LIBRARY_PATH", "").split(":")
    dsp = os.environ.get("ADSP_LIBRARY_PATH", "").split(";")
    backend = _host(fs, cwd, args.backend)
    if not backend.is_file():
        raise Fail(f"[ ERROR ] Unable to load backend. dlerror(): dlopen failed: library \"{args.backend}\" not found")
    if backend.name != "libQnnHtp.so":
        raise Fail(f"[ ERROR ] stand-in: only the HTP backend (libQnnHtp.so) runs context binaries here, not "
                   f"{backend.name}")
    if not _find(fs, libraries, f"libQnnHtp{arch}Stub.so"):
        raise Fail(f"[ ERROR ] Unable to load backend. dlerror(): dlopen failed: library \"libQnnHtp{arch}Stub.so\" "
                   "not found (LD_LIBRARY_PATH)")
    system = args.system_library or "libQnnSystem.so"
    if not (_host(fs, cwd, system).is_file() if "/" in system else _find(fs, libraries, system)):
        raise Fail(f"[ ERROR ] Unable to load system library: dlopen failed: library \"{system}\" not found")
    if not _find(fs, dsp, f"libQnnHtp{arch}Skel.so"):
        raise Fail(f"[ ERROR ] DspTransport.openSession qnn_open failed, 0x80000406; failed to load "
                   f"libQnnHtp{arch}Skel.so (ADSP_LIBRARY_PATH={os.environ.get('ADSP_LIBRARY_PATH', '')!r})")
    if not args.retrieve_context:
        raise Fail("[ ERROR ] stand-in: only --retrieve_context <context binary> runs on the stand-in phone")
    binary = _host(fs, cwd, args.retrieve_context)
    if not binary.is_file():
        raise Fail(f"[ ERROR ] Could not open {args.retrieve_context}")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # build_rules, for the emulator
    from build_rules import dist
    from build_rules.toolchains import ort_qnn
    target = ort_qnn.read_binary_target(binary)
    if f"V{target['arch']}" != arch:
        raise Fail(f"[ ERROR ] Failed to create context from binary: binary is for v{target['arch']} "
                   f"({target['soc_type']}), this device's HTP is {arch.lower()}; QNN_CONTEXT_ERROR_CREATE_FROM_BINARY")
    ctx = _contract(binary, Path(phone["host_repo"]))
    contract = dist.contract_from_ctx(ctx)
    inputs = _read_list(fs, cwd, args, contract)
    import numpy as np
    with tempfile.TemporaryDirectory(prefix="fake-net-run-") as tmp:
        started = time.perf_counter()
        wrapper = dist._bare_binary_model(ctx, binary, contract, Path(tmp))
        run = ort_qnn.open_context_binary(wrapper)
        init_us = (time.perf_counter() - started) * 1e6
        output_dir = _host(fs, cwd, args.output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        events = [{"event": "Init", "us": init_us}]
        count = args.num_inferences or len(inputs)
        deadline = time.monotonic() + args.duration if args.duration is not None else None
        index = 0
        while (index < count) if deadline is None else (time.monotonic() < deadline):
            sample = inputs[index % len(inputs)]
            feed = {t["name"]: (sample[t["name"]] if args.use_native_input_files else dist.quantize(sample[t["name"]], t))
                    for t in contract["inputs"]}
            started = time.perf_counter()
            raw = run(feed)
            events.append({"event": "Execute", "us": (time.perf_counter() - started) * 1e6})
            keep = args.keep_num_outputs if args.keep_num_outputs is not None else len(inputs)
            if index < min(keep, len(inputs)):
                folder = output_dir / f"Result_{index}"
                folder.mkdir(parents=True, exist_ok=True)
                for t in contract["outputs"]:
                    value = raw[t["name"]]
                    if not args.use_native_output_files:
                        value = dist.dequantize(value, t).astype(np.float32)
                    np.ascontiguousarray(value).tofile(folder / f"{t['qnn_name']}.raw")
            index += 1
        if args.profiling_level:
            with open(output_dir / "qnn-profiling-data_0.log", "w") as log:
                log.write(json.dumps({"stand_in": "qnn-net-run", "graph": contract["qnn_graph"],
                                      "profiling_level": args.profiling_level,
                                      "perf_profile": args.perf_profile or "default"}) + "\n")
                for event in events:
                    log.write(json.dumps(event) + "\n")
    print(f"qnn-net-run (stand-in): {index} inference(s) of {binary.name} on the x86 HTP emulator")
    return 0


def _read_list(fs: Path, cwd: str, args, contract: dict) -> list[dict]:
    import numpy as np
    from build_rules import dist
    by_qnn = {t["qnn_name"]: t for t in contract["inputs"]}
    samples = []
    for number, line in enumerate(_host(fs, cwd, args.input_list).read_text().splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        sample = {}
        for position, entry in enumerate(line.split()):
            name, sep, path = entry.partition(":=")
            if not sep:
                name, path = contract["inputs"][position]["qnn_name"], entry
            if name not in by_qnn:
                raise Fail(f"[ ERROR ] input list line {number}: no graph input '{name}' (inputs: {', '.join(by_qnn)})")
            tensor = by_qnn[name]
            file = _host(fs, cwd, path)
            if not file.is_file():
                raise Fail(f"[ ERROR ] input list line {number}: cannot open {path}")
            dtype = np.dtype(dist.NUMPY_DTYPES[tensor["dtype"]]) if args.use_native_input_files else np.float32
            data = np.fromfile(file, dtype=dtype)
            if data.size != int(np.prod(tensor["shape"])):
                raise Fail(f"[ ERROR ] {path}: {data.size} values of {dtype}, input '{name}' has {tensor['shape']}")
            sample[tensor["name"]] = data.reshape(tensor["shape"])
        if set(sample) != {t["name"] for t in contract["inputs"]}:
            raise Fail(f"[ ERROR ] input list line {number}: {len(sample)} of {len(by_qnn)} inputs given")
        samples.append(sample)
    if not samples:
        raise Fail("[ ERROR ] the input list is empty")
    return samples

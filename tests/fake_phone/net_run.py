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
knowledge from outside the phone. With --profiling_level it turns on QNN's own profiling in the emulator and writes
QNN's binary profiling log as <output_dir>/qnn-profiling-data_0.log; the CSV QNN wrote with it is kept for the
stand-in qnn-profile-viewer (profile_viewer.py). The times are the x86 emulator's, not a phone's.

A binary of the stand-in QAIRT SDK (tests/fake_qairt: not a QNN artefact; its header carries the float ONNX model
it was made from and its QNN-side I/O) is run as that SDK's own qnn-net-run runs it: the float ONNX model on the
host CPU, inputs and outputs in the binary's QNN layout (channel-last where the converter made them so). Its
profile rows (load, one execute per inference) are this stand-in's wall clock of that, in QNN's event names: they
show the plumbing of profile for qairt binaries, nothing about QNN.
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
    # A stand-in that dies of a signal (a native crash of the emulator behind it) says so in its log, which the
    # tool's error quotes (a power loop once seemed to end after 2.5 s of 4 with nothing in its log but LIBNATIVE's
    # line: power judged it by its last sighting, an adb round trip early on a busy host; now by its first absence)
    import faulthandler
    faulthandler.enable()
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
    if args.perf_profile:  # QAIRT's usage text: deprecated for HTP in favour of the backend extension config
        print("[ WARNING ] --perf_profile is deprecated for the HTP backend: set perf_profile in the backend "
              "extension config (--config_file)", file=sys.stderr)
    if args.config_file:
        _check_config(fs, cwd, args.config_file)
    if not args.retrieve_context:
        raise Fail("[ ERROR ] stand-in: only --retrieve_context <context binary> runs on the stand-in phone")
    binary = _host(fs, cwd, args.retrieve_context)
    if not binary.is_file():
        raise Fail(f"[ ERROR ] Could not open {args.retrieve_context}")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # build_rules, for the emulator
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the stand-in SDK's binaries
    from fake_qairt import tools as qairt_tools
    _refuse_a_newer_binary(backend, binary, qairt_tools)
    if binary.read_bytes().startswith(qairt_tools.STAND_IN_BINARY):
        return _run_qairt_stand_in(args, fs, cwd, binary, arch, qairt_tools)
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
    # in the phone's own folder: a loop killed on the phone (power, Ctrl-C) never removes it, and /tmp kept one per kill
    with tempfile.TemporaryDirectory(prefix="fake-net-run-", dir=fs.parent) as tmp:
        wrapper = dist._bare_binary_model(ctx, binary, contract, Path(tmp))
        profile_csv = Path(tmp) / "profile.csv"
        run, close = _session(wrapper, args.profiling_level, profile_csv)
        output_dir = _host(fs, cwd, args.output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        count = args.num_inferences or len(inputs)
        deadline = time.monotonic() + args.duration if args.duration is not None else None
        index = 0
        while (index < count) if deadline is None else (time.monotonic() < deadline):
            sample = inputs[index % len(inputs)]
            feed = {t["name"]: sample[t["name"]] if args.use_native_input_files else dist.quantize(sample[t["name"]], t)
                    for t in contract["inputs"]}
            raw = run(feed)
            keep = args.keep_num_outputs if args.keep_num_outputs is not None else len(inputs)
            if index < min(keep, len(inputs)):
                folder = output_dir / f"Result_{index}"
                folder.mkdir(parents=True, exist_ok=True)
                for t in contract["outputs"]:
                    value = raw[t["name"]]
                    if not args.use_native_output_files:
                        value = dist.dequantize(value, t).astype(np.float32)
                    # a string join (assumed of qnn-net-run): the name "/a/b" is the file a/b.raw below Result_<n>
                    path = Path(f"{folder}/{t['qnn_name']}.raw")
                    path.parent.mkdir(parents=True, exist_ok=True)
                    np.ascontiguousarray(value).tofile(path)
            index += 1
        close()  # QNN writes its profile when the session ends
        if args.profiling_level:
            _keep_profile(profile_csv, output_dir / "qnn-profiling-data_0.log")
    print(f"qnn-net-run (stand-in): {index} inference(s) of {binary.name} on the x86 HTP emulator")
    return 0


def _check_config(fs: Path, cwd: str, config_file: str) -> None:
    """--config_file as QNN's docs give it: {"backend_extensions": {"shared_library_path", "config_file_path"}}; the
    HTP extension config's devices[].cores[].perf_profile one of the documented values."""
    def load(path: str, what: str) -> dict:
        file = _host(fs, cwd, path)
        if not file.is_file():
            raise Fail(f"[ ERROR ] Could not open {what} {path}")
        try:
            return json.loads(file.read_text())
        except ValueError as e:
            raise Fail(f"[ ERROR ] {what} {path} is not JSON: {e}") from None
    extensions = load(config_file, "config file").get("backend_extensions") or {}
    library, htp = extensions.get("shared_library_path"), extensions.get("config_file_path")
    if not library or not htp:
        raise Fail(f"[ ERROR ] {config_file}: backend_extensions needs shared_library_path and config_file_path")
    if not _host(fs, cwd, library).is_file():
        raise Fail(f"[ ERROR ] Unable to load backend extensions library: dlopen failed: library \"{library}\" not found")
    for device in load(htp, "backend extension config").get("devices", []):
        for core in device.get("cores", []):
            if "perf_profile" in core and core["perf_profile"] not in PERF_PROFILES:
                raise Fail(f"[ ERROR ] {htp}: unknown perf_profile {core['perf_profile']!r}")


def _on_one_core() -> None:
    """This process (and the emulator threads it starts) on the core it runs on now, as the build pins its own
    emulator sessions (emulator_slots): unpinned, the emulator's threads spread over every core of the host and took
    twice the CPU for no shorter run, CPU the tests beside it wait for. (The phone's own loop runs on its NPU.)"""
    cpu = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[36])  # field 39: the CPU last run on
    os.sched_setaffinity(0, {cpu})


def _session(model: Path, level: str | None, csv_path: Path):
    """The binary on the HTP emulator; with a profiling level, QNN's own profiling on (basic / detailed), which
    writes csv_path and, from QNN 2.39 (QAIRT API >= 2.29), <csv stem>_qnn.log: QNN's binary profiling log, the
    file qnn-profile-viewer reads."""
    from build_rules.toolchains import ort_qnn
    ort = ort_qnn._ort()
    options = {"backend_type": "htp"}
    if level:
        options.update(profiling_level="detailed" if level == "detailed" else "basic",
                       profiling_file_path=str(csv_path))
    _on_one_core()
    session = ort.InferenceSession(str(model), sess_options=ort_qnn._qnn_session_options(ort, options))
    session.disable_fallback()
    names = [o.name for o in session.get_outputs()]
    holder = [session]

    def close():
        holder.clear()  # the last reference: the session ends and QNN writes the profile
        import gc
        gc.collect()
    return (lambda feed: dict(zip(names, holder[0].run(names, feed)))), close


def _keep_profile(csv_path: Path, log: Path) -> None:
    """The log the phone keeps is QNN's own binary log; the CSV QNN wrote beside it is filed under the log's sha256 in
    the phone's folder, where the stand-in qnn-profile-viewer (which cannot parse the binary format) finds it."""
    import shutil
    binary_log = csv_path.with_name(csv_path.stem + "_qnn.log")
    if not binary_log.is_file() or not csv_path.is_file():
        raise Fail(f"[ ERROR ] stand-in: QNN wrote no profile ({sorted(p.name for p in csv_path.parent.iterdir())})")
    shutil.copyfile(binary_log, log)
    store = Path(os.environ["FAKE_PHONE_DIR"]) / "profiles"
    store.mkdir(exist_ok=True)
    shutil.copyfile(csv_path, store / f"{hashlib.sha256(log.read_bytes()).hexdigest()}.csv")


def _read_list(fs: Path, cwd: str, args, contract: dict) -> list[dict]:
    from build_rules import dist
    return _parse_list(fs, cwd, args.input_list, [
        (t["qnn_name"], t["name"], t["shape"], dist.NUMPY_DTYPES[t["dtype"]] if args.use_native_input_files else "float32")
        for t in contract["inputs"]])


def _parse_list(fs: Path, cwd: str, input_list: str, inputs: list[tuple]) -> list[dict]:
    """qnn-net-run's input list: a line per inference, `name:=path` entries (or paths in input order); inputs are
    (QNN name, the sample's key, shape, numpy dtype of the raw file)."""
    import numpy as np
    by_qnn = {qnn: (key, shape, dtype) for qnn, key, shape, dtype in inputs}
    samples = []
    for number, line in enumerate(_host(fs, cwd, input_list).read_text().splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        sample = {}
        for position, entry in enumerate(line.split()):
            name, sep, path = entry.partition(":=")
            if not sep:
                name, path = inputs[position][0], entry
            if name not in by_qnn:
                raise Fail(f"[ ERROR ] input list line {number}: no graph input '{name}' (inputs: {', '.join(by_qnn)})")
            key, shape, dtype = by_qnn[name]
            file = _host(fs, cwd, path)
            if not file.is_file():
                raise Fail(f"[ ERROR ] input list line {number}: cannot open {path}")
            data = np.fromfile(file, dtype=np.dtype(dtype))
            if data.size != int(np.prod(shape)):
                raise Fail(f"[ ERROR ] {path}: {data.size} values of {dtype}, input '{name}' has {list(shape)}")
            sample[key] = data.reshape(shape)
        if len(sample) != len(by_qnn):
            raise Fail(f"[ ERROR ] input list line {number}: {len(sample)} of {len(by_qnn)} inputs given")
        samples.append(sample)
    if not samples:
        raise Fail("[ ERROR ] the input list is empty")
    return samples


def _refuse_a_newer_binary(backend: Path, binary: Path, tools) -> None:
    """A context binary from a newer SDK than the runtime's HTP backend does not load (QNN: only the runtime of the
    binary's SDK or a newer one loads it). The runtime's version is the pushed backend library's (the stand-in SDK's
    placeholder says "of QAIRT <version>"); the binary's is the QNN build id a real one embeds (v2.51.0.2609...), or
    the stand-in SDK's stamp. The messages are the ones a 2.32 runtime printed for a 2.50 binary (a public field
    note; QnnContext.h: QNN_CONTEXT_ERROR_BINARY_VERSION, "incompatible version of the binary")."""
    import re
    runtime = re.search(rb"of QAIRT (\d+)\.(\d+)\.(\d+)", backend.read_bytes()[:4096])
    data = binary.read_bytes()
    if data.startswith(tools.STAND_IN_BINARY):
        made = re.match(r"(\d+)\.(\d+)\.(\d+)", tools._binary_meta(str(binary))["sdk_version"])
    else:
        made = re.search(rb"v(\d+)\.(\d+)\.(\d+)\.\d{8,}", data)
    if runtime and made and tuple(map(int, made.groups())) > tuple(map(int, runtime.groups())):
        raise Fail("<E> Using newer context binary on old SDK\n<E> Fail to get context blob with err 5000\n"
                   "<E> Failed to create context from binary with err 0x1388")


def _run_qairt_stand_in(args, fs: Path, cwd: str, binary: Path, arch: str, tools) -> int:
    import numpy as np
    meta = tools._binary_meta(str(binary))
    if meta.get("graphs"):
        raise Fail("[ ERROR ] stand-in: a weight-shared context holds several graphs; name one (not supported here)")
    if f"V{meta['dsp_arch']}" != arch:
        raise Fail(f"[ ERROR ] Failed to create context from binary: binary is for v{meta['dsp_arch']} (soc "
                   f"{meta['soc_id']}), this device's HTP is {arch.lower()}; QNN_CONTEXT_ERROR_CREATE_FROM_BINARY")
    samples = _parse_list(fs, cwd, args.input_list, [(t["name"], t["name"], t["dims"], "float32")
                                                     for t in meta["inputs"]])
    started = time.perf_counter()
    session = tools._cpu_session(meta["source"])
    rows = [("QNN (load binary) time", (time.perf_counter() - started) * 1e6)]
    output_dir = _host(fs, cwd, args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    count = args.num_inferences or len(samples)
    deadline = time.monotonic() + args.duration if args.duration is not None else None
    keep = args.keep_num_outputs if args.keep_num_outputs is not None else len(samples)
    index = 0
    while (index < count) if deadline is None else (time.monotonic() < deadline):
        feed = tools._onnx_feed(meta, samples[index % len(samples)])
        started = time.perf_counter()
        values = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))
        rows.append(("QNN (execute) time", (time.perf_counter() - started) * 1e6))
        if index < min(keep, len(samples)):
            for t in meta["outputs"]:
                value = np.asarray(values[t["onnx_name"]])
                out = output_dir / f"Result_{index}" / f"{t['name']}.raw"
                out.parent.mkdir(parents=True, exist_ok=True)
                np.ascontiguousarray(value.transpose(t["perm"]) if t.get("perm") else value).astype(
                    np.float32).tofile(out)
        index += 1
    if args.profiling_level:
        import uuid
        log = output_dir / "qnn-profiling-data_0.log"
        log.write_bytes(b"stand-in qnn-net-run profile of a stand-in QAIRT binary " + uuid.uuid4().bytes)
        store = Path(os.environ["FAKE_PHONE_DIR"]) / "profiles"
        store.mkdir(exist_ok=True)
        with open(store / f"{hashlib.sha256(log.read_bytes()).hexdigest()}.csv", "w", newline="") as f:
            f.write("Msg Timestamp,Message,Time,Unit of Measurement,Timing Source,Event Level,Event Identifier\n")
            for i, (event, micros) in enumerate(rows):
                f.write(f"{i},BACKEND,{micros:.0f},US,BACKEND,ROOT,{event}\n")
    print(f"qnn-net-run (stand-in): {index} inference(s) of {binary.name} (stand-in QAIRT binary: the float ONNX "
          "model on the host CPU)")
    return 0

"""Device bundles: what `doit dist` ships per model and variant, and the two commands a device integrator runs.

    python -m build_rules.dist select <bundle> --soc-model 69      (or SM8750): the chip folder to load
    python -m build_rules.dist verify <bundle>                     checksums, binary targets, I/O contract
                                                                   (on as many samples as `doit dist` checked)

A bundle (out/<model>/dist/<variant>/) holds per chip <chip>/<graph>.bin (the raw QNN context binary) and, with
the ort-qnn toolchain, <chip>/<graph>_ctx.onnx (the same as an EPContext model); index.json (chips, SoC ids,
toolchain, and per graph the I/O contract as the binary sees it); SHA256SUMS over every other file; LICENSES/;
the float ONNX graphs for a CPU fallback (cpu/, unless [dist] cpu_fallback = false); the QNN runtime libraries
when the toolchain has them (qairt: runtime/), and, with [dist] multi_soc, one Flexible Context Binary per graph
for all the chips (multi_soc/). <model>-<variant>.tar.gz beside it holds the same files, byte for byte the same
archive whenever it is made from the same files.

Importing this module stays light (doit loads it for the summary): onnx, onnxruntime and numpy are imported
inside the functions that run binaries.
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import struct
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from .emulator import emulator_slots
# The contract code, kept importable from here (dist.contract_from_ctx, dist.DistError, ...).
from .bundles.dist_contract import (FIXED_DTYPES, NUMPY_DTYPES, PLAIN_DTYPES, DistError, _bare_binary_model,  # noqa: F401
                            _EmulatorRefused, contract_from_ctx, contract_from_manifest, dequantize, quantize, sha256)

INDEX = "index.json"
SUMS = "SHA256SUMS"
FORMAT = 1
# QNN's fixed-point convention, written into every index.json so that the file explains itself.
CONVENTIONS = {
    "offset": "QNN convention: real = scale * (q + offset), so offset = -zero_point of ONNX's QuantizeLinear "
              "(q = round(real / scale) - offset, clamped to the dtype's range). scale and offset are null for "
              "FLOAT_32, FLOAT_16 and INT_32 tensors, which the app passes as they are.",
    "dtype": "the QNN data type of the binary's own input or output tensor, without the QNN_DATATYPE_ prefix "
             "(UFIXED_POINT_16 = uint16 buffers, UFIXED_POINT_8 = uint8, FLOAT_32 = float32, INT_32 = int32).",
    "name": "the float ONNX graph's input or output name (also in cpu/<graph>.onnx and <graph>_ctx.onnx); "
            "qnn_name: the binary's own tensor name. Tensors are listed in the binary's order",
    "shape": "dims of the binary's tensor, in this order",
    "layout": "null: the dims are in the order of the float ONNX graph (the ort-qnn toolchain never transposes "
              "graph I/O); otherwise the QNN layout of the tensor's dims, e.g. NHWC",
    "soc_model": "QNN's SoC model number (ONNX Runtime's soc_model option, QnnDevice's socModel); not the "
                 "kernel's /sys/devices/soc0/soc_id",
    "ro.soc.model": "what `adb shell getprop ro.soc.model` prints on a phone with this chip",
}
FIXED_MTIME = 0  # tar entries and the gzip header: a rebuild from the same files gives the same archive
VERIFY_STEPS = 3  # greedy steps `doit dist` runs through a step graph's bare binary, state fed back in fixed point


# --- files ------------------------------------------------------------------------------------------------

def bundle_files(bundle: Path) -> list[str]:
    """Every file of a bundle but SHA256SUMS, as sorted paths relative to it ('/' separated)."""
    found = []
    for folder, dirs, files in os.walk(bundle):
        dirs.sort()
        for name in files:
            rel = Path(folder, name).relative_to(bundle).as_posix()
            if rel != SUMS:
                found.append(rel)
    return sorted(found)


def write_sums(bundle: Path) -> None:
    """SHA256SUMS in `sha256sum` format (two spaces: text mode), so `sha256sum -c SHA256SUMS` checks it."""
    lines = [f"{sha256(bundle / rel)}  {rel}\n" for rel in bundle_files(bundle)]
    (bundle / SUMS).write_text("".join(lines))


def check_sums(bundle: Path) -> list[str]:
    """Problems with the bundle's files against SHA256SUMS, first the ones a reader should fix first."""
    sums_file = bundle / SUMS
    if not sums_file.is_file():
        return [f"{sums_file}: missing"]
    listed = {}
    for number, line in enumerate(sums_file.read_text().splitlines(), 1):
        digest, sep, rel = line.partition("  ")
        if not sep or len(digest) != 64:
            return [f"{sums_file}:{number}: not a sha256sum line: {line!r}"]
        listed[rel] = digest
    problems = []
    for rel, digest in listed.items():
        path = bundle / rel
        if not path.is_file():
            problems.append(f"{path}: missing (listed in {SUMS})")
        elif sha256(path) != digest:
            problems.append(f"{path}: altered (its SHA-256 differs from {SUMS})")
    problems += [f"{bundle / rel}: not listed in {SUMS}" for rel in bundle_files(bundle) if rel not in listed]
    return problems


def write_tarball(bundle: Path, target: Path, prefix: str) -> None:
    """<prefix>/... with every file of the bundle: sorted entries, mtime 0, owner 0:0 without names, fixed modes,
    and a gzip header without time or file name, so the same files always give the same bytes."""
    files = bundle_files(bundle) + [SUMS]
    folders = {"/".join(rel.split("/")[:depth]) for rel in files for depth in range(1, rel.count("/") + 1)}
    entries = sorted([(name, None) for name in folders] + [(rel, bundle / rel) for rel in files],
                     key=lambda entry: entry[0])
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "wb") as raw, \
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=FIXED_MTIME, compresslevel=6) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, path in [("", None), *entries]:
            info = tarfile.TarInfo(f"{prefix}/{name}" if name else prefix)
            info.mtime, info.uid, info.gid, info.uname, info.gname = FIXED_MTIME, 0, 0, "", ""
            if path is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
                continue
            info.size, info.mode = path.stat().st_size, 0o644
            with open(path, "rb") as f:
                tar.addfile(info, f)


# --- the step contract of a graph with state (a decoder step, a recurrent cell) ----------------------------

def _same_encoding(a: dict, b: dict) -> bool:
    return a["dtype"] == b["dtype"] and a["scale"] == b["scale"] and a["offset"] == b["offset"]


def step_entry(step: dict, io_contract: dict, outputs_elsewhere: dict[str, str]) -> dict:
    """graphs.<graph>.step of the index: which output feeds which input at the next step, where a cache output is
    written, the mask, the greedy feedback, and which inputs other graphs' outputs of the same name feed once
    (per utterance, e.g. the encoder's cross K/V). `step` is config.Graph.step_contract(); the encodings come from
    the binary's I/O contract, so `same_encoding` says whether the app may copy the output buffer as it is."""
    inputs = {t["name"]: t for t in io_contract["inputs"]}
    outputs = {t["name"]: t for t in io_contract["outputs"]}
    state = []
    for output, target in step["state"].items():
        if output not in outputs or target not in inputs:
            raise DistError(f"state {output} -> {target}: not in the binary's I/O contract "
                            f"(inputs {sorted(inputs)}, outputs {sorted(outputs)})")
        same = _same_encoding(outputs[output], inputs[target])
        state.append({"output": output, "input": target, "same_encoding": same,
                      "write": "copy the output buffer as it is" if same else
                               "convert: dequantize with the output's scale/offset, quantize with the input's"})
    cache = dict(step["cache"]) if step.get("cache") else None
    if cache:
        cache["mask_values"] = {"not_written": 1, "written": 0} if cache.get("mask") else None
    fed = {step["cache"]["offset"], step["cache"]["mask"]} if cache else set()
    if step.get("greedy"):
        fed.add(step["greedy"]["token"])
    fed |= {entry["input"] for entry in state}
    once = {name: outputs_elsewhere[name] for name in inputs if name not in fed and name in outputs_elsewhere}
    zero = "set every state input to 0.0 (in fixed point: q = -offset)"
    if cache:
        how = (f"per sequence: {zero}, every value of '{cache['mask']}' to 1 (not written), "
               if cache.get("mask") else f"per sequence: {zero}, ") + \
              (f"offset = 0; per step: set '{cache['offset']}' to offset, run, write each state output into its input "
               f"at index offset along axis {cache['axis']} (as `write` says), "
               + (f"set {cache['mask']}[offset] = 0, " if cache.get("mask") else "")
               + f"offset += 1; at most {cache['length']} steps")
    else:
        how = f"per sequence: {zero}; per step: run, then each state output replaces its input (as `write` says)"
    if step.get("greedy"):
        how += (f"; greedy decoding: the argmax of '{step['greedy']['logits']}' over its last axis is the next "
                f"'{step['greedy']['token']}'")
    if once:
        how += "; " + ", ".join(f"'{n}'" for n in once) + " come once per sequence from the output of the same name " \
               "of graph " + "/".join(sorted(set(once.values())))
    return {"state": state, "cache": cache, "greedy": step.get("greedy"), "inputs_from_graphs": once, "how": how}


# --- Flexible Context Binary (multi-SoC) records -----------------------------------------------------------

def multi_soc_records(binary: str | os.PathLike) -> list[dict]:
    """The per-SoC records of a Flexible Context Binary (a DLC: a zip of stored members whose CRC fields are 0):
    [{"record", "soc_model", "dsp_arch", "soc_type", "graphs": {qnn graph: {"inputs", "outputs"}}}] from its
    dlc.metadata JSON (QnnSystemContext binary info per record) and each record's embedded HTP config."""
    members = _stored_members(Path(binary))
    metadata = [name for name in members if name.startswith("dlc.metadata")]
    if not metadata:
        raise DistError(f"{binary}: no dlc.metadata member; not a Flexible Context Binary")
    info = json.loads(members[metadata[0]].decode("utf-8").rstrip("\0"))
    records = []
    for cache in info.get("cacheList", []):
        name = cache.get("cacheName", "")
        config = _htp_config(members.get(name, b""))
        graphs = {}
        for g in cache.get("graphs", []):
            graphs[g.get("graphName")] = {side: [_record_tensor(t) for t in g.get(key, [])]
                                          for side, key in (("inputs", "graphInputs"), ("outputs", "graphOutputs"))}
        arch = (cache.get("contextMetadata") or {}).get("dspArch")
        records.append({"record": name, "soc_model": cache.get("socModel"),
                        "dsp_arch": f"v{arch}" if arch is not None else None,
                        "soc_type": config.get("soc_type"), "bytes": len(members.get(name, b"")), "graphs": graphs})
    return records


def _record_tensor(t: dict) -> dict:
    params = (t.get("quantizeParams") or {})
    scale_offset = params.get("scaleOffset") if params.get("definition") == "QNN_DEFINITION_DEFINED" else None
    return {"name": t.get("name"), "shape": t.get("dimensions"),
            "dtype": str(t.get("dataType", "")).removeprefix("QNN_DATATYPE_"),
            "scale": scale_offset["scale"] if scale_offset else None,
            "offset": scale_offset["offset"] if scale_offset else None}


def _stored_members(path: Path) -> dict[str, bytes]:
    """Members of a zip with stored (uncompressed) entries, read from the local headers (Python's zipfile refuses
    the DLC's zero CRCs)."""
    import zipfile
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile as e:
        raise DistError(f"{path}: not a Flexible Context Binary (not a zip/DLC container: {e})") from None
    members = {}
    with archive, open(path, "rb") as f:
        for info in archive.infolist():
            if info.compress_type != zipfile.ZIP_STORED:
                raise DistError(f"{path}: member {info.filename} is compressed; unknown DLC layout")
            f.seek(info.header_offset)
            header = f.read(30)
            name_length, extra_length = struct.unpack("<HH", header[26:30])
            f.seek(info.header_offset + 30 + name_length + extra_length)
            members[info.filename] = f.read(info.compress_size)
    return members


def _htp_config(blob: bytes) -> dict:
    at = blob.find(b"soc_type=")
    if at < 0:
        return {}
    end = at
    while end < len(blob) and 0x20 <= blob[end] < 0x7f:
        end += 1
    fields = {}
    for item in blob[at:end].decode("ascii").split(";"):
        key, sep, value = item.partition("=")
        if sep:
            fields.setdefault(key, value)
    return fields


def compare_record_io(record_io: dict, contract: dict) -> str | None:
    """Where a multi-SoC record's graph I/O differs from the index's contract (names in order, dtype, shape,
    scale and offset), or None."""
    for side in ("inputs", "outputs"):
        mine, theirs = record_io.get(side, []), contract[side]
        if [t["name"] for t in mine] != [t.get("qnn_name", t["name"]) for t in theirs]:
            return f"{side} {[t['name'] for t in mine]}, the index has {[t.get('qnn_name', t['name']) for t in theirs]}"
        for a, b in zip(mine, theirs):
            if a["dtype"] != b["dtype"] or list(a["shape"] or []) != list(b["shape"]):
                return f"{side[:-1]} '{a['name']}' is {a['dtype']}{a['shape']}, the index has {b['dtype']}{b['shape']}"
            if b["scale"] is not None and (a["scale"] is None or abs(a["scale"] - b["scale"]) > 1e-6 * abs(b["scale"])
                                           or a["offset"] != b["offset"]):
                return (f"{side[:-1]} '{a['name']}' has scale {a['scale']} offset {a['offset']}, the index has "
                        f"scale {b['scale']} offset {b['offset']}")
    return None


# --- select ------------------------------------------------------------------------------------------------

def read_index(bundle: Path) -> dict:
    path = bundle / INDEX
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise DistError(f"{path}: missing; is {bundle} a bundle (out/<model>/dist/<variant>/)?") from None
    except ValueError as e:
        raise DistError(f"{path}: not valid JSON: {e}") from None


def select_chip(index: dict, soc: str) -> str | None:
    """The chip whose binaries a phone with this SoC loads: `soc` is QNN's soc_model number ("69") or the
    phone's ro.soc.model ("SM8750", any case). None when the bundle has no binary for it."""
    wanted = soc.strip()
    for chip, entry in index["chips"].items():
        if wanted.isdigit() and int(wanted) == entry["soc_model"]:
            return chip
        if wanted.upper() == str(entry["ro.soc.model"]).upper():
            return chip
    return None


def fallback_message(index: dict, soc: str, bundle: Path) -> str:
    known = ", ".join(f"{c} (soc_model {e['soc_model']}, {e['dsp_arch']})" for c, e in index["chips"].items())
    fallback = index.get("cpu_fallback", {})
    graphs = fallback.get("graphs", {})
    where = ", ".join(str(bundle / p) for p in graphs.values()) if fallback.get("shipped") else \
        ", ".join(f"{p} (not in the bundle: [dist] cpu_fallback = false; that file of the build)" for p in graphs.values())
    return (f"no binary in this bundle for SoC {soc!r} (bundle chips: {known}); a context binary runs only on the "
            f"SoC it was built for. Fall back to the CPU: run the float ONNX graph(s) {where} with ONNX Runtime's "
            "CPU execution provider")


# --- verify ------------------------------------------------------------------------------------------------

def verify(bundle: Path, evaluation: dict[str, Path] | None = None, samples: int | None = None,
           say=print, steps: int = VERIFY_STEPS) -> dict:
    """Check a bundle as a device integrator would before shipping it; raises DistError naming the first problem.

    1. every file against SHA256SUMS (missing, altered, unlisted);
    2. each binary's embedded soc_type/arch against the index (and each multi-SoC record's SoC and I/O);
    3. the I/O contract on the x86 HTP emulator, per chip and graph (ort-qnn bundles): real evaluation inputs
       quantized with the index's scale/offset run through the bare context binary (an EPContext model with
       fixed-point I/O and no Q/DQ around it), its outputs dequantized with the index, against the bundle's
       <graph>_ctx.onnx run on the float inputs: equal within one quantization step of each output;
    4. for a step graph (index graphs.<graph>.step), `steps` greedy steps from its first evaluation sample with the
       state fed back as the index says: in the binary's fixed-point types through the bare binary, in float
       through <graph>_ctx.onnx; every step's outputs within one quantization step, the same greedy tokens.
    `evaluation`: graph -> <graph>.evaluation.npz (default: out/<model>/float/ beside the bundle's dist folder).
    Returns {"files": n, "binaries": n, "contract": {chip/graph: {...}}, "steps": {chip/graph: {...}},
    "multi_soc": {...}}."""
    bundle = Path(bundle)
    problems = check_sums(bundle)
    if problems:
        raise DistError(problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    index = read_index(bundle)
    files = len(bundle_files(bundle))
    say(f"{files} files match {SUMS}")
    binaries = _check_targets(bundle, index, say)
    result = {"files": files, "binaries": binaries, "contract": {}, "steps": {}, "multi_soc": {}}
    if samples == 0:
        say("I/O contract: not run on the emulator (0 samples)")
        return result
    say(f"I/O contract: {'every' if samples is None else samples} evaluation sample(s) per graph and chip")
    if index["toolchain"]["name"] != "ort-qnn":
        say(f"I/O contract: not run on the emulator: a {index['toolchain']['name']} bundle has no <graph>_ctx.onnx "
            "float path to compare with (its check stage ran the binaries with qnn-net-run where the SDK has it)")
        return result
    evaluation = dict(evaluation or {})
    for graph in index["graphs"]:
        if graph not in evaluation:
            evaluation[graph] = bundle.resolve().parent.parent / "float" / f"{graph}.evaluation.npz"
        if not Path(evaluation[graph]).is_file():
            raise DistError(f"no evaluation inputs for graph '{graph}': {evaluation[graph]} not found; pass "
                            "--evaluation DIR (a folder with <graph>.evaluation.npz, out/<model>/float/ of the "
                            "build)")
    from .measuring.samples import load_evaluation
    inputs = {g: load_evaluation(str(evaluation[g]), samples)[0] for g in index["graphs"]}  # once, not per chip
    for chip in index["chips"]:
        for graph, entry in index["graphs"].items():
            where = f"{chip}/{graph}"
            if entry.get("parts"):  # a split graph: its parts as a chain, fixed-point buffers passed on at each cut
                from .bundles.dist_parts import verify_chain
                measured = verify_chain(bundle / chip, graph, entry, Path(evaluation[graph]), samples, where,
                                        inputs=inputs[graph])
                result["contract"][where] = measured
                say(f"{where}: {measured['parts']} parts chained through the bare binaries hold the I/O contract "
                    f"on the HTP emulator over {measured['samples']} samples (worst output: "
                    f"{measured['worst_steps']:.2f} of one quantization step)")
            else:
                began = time.monotonic()
                seconds, sessions = emulator_slots.session_seconds(), emulator_slots.session_count()
                measured = check_contract(bundle / chip, graph, entry["io"], Path(evaluation[graph]), samples, where,
                                          inputs=inputs[graph])
                result["contract"][where] = measured
                timing = _timing(time.monotonic() - began, emulator_slots.session_seconds() - seconds,
                                 emulator_slots.session_count() - sessions)
                say(f"{where}: I/O contract holds on the HTP emulator over {measured['samples']} samples "
                    f"(worst output: {measured['worst_steps']:.2f} of one quantization step; {timing})")
            if entry.get("step") and steps:
                walked = check_steps(bundle / chip, graph, entry, Path(evaluation[graph]), steps, where)
                result["steps"][where] = walked
                floats = "its parts' _ctx.onnx chained" if entry.get("parts") else f"{graph}_ctx.onnx"
                # a recurrent cell (no `greedy`) steps on its evaluation inputs: no tokens to name
                kind, tokens = ("greedy ", f"tokens {walked['tokens']}; ") if entry["step"].get("greedy") else ("", "")
                say(f"{where}: {walked['steps']} {kind}steps with the state fed back in the binary's own types "
                    f"agree with {floats} ({tokens}worst output: {walked['worst_steps']:.2f} of one quantization step)")
    multi = index.get("multi_soc") or {}
    for graph, entry in (multi.get("graphs") or {}).items():
        result["multi_soc"][graph] = _try_multi_soc_on_emulator(bundle, graph, entry, index, evaluation, samples, say,
                                                                inputs.get(graph))
    return result


def _timing(seconds: float, session_seconds: float, sessions: int) -> str:
    """'8.1 s on 2 emulator sessions': the wall time of one chip's contract check, and the time it waited for one of
    the machine's emulator slots when that is most of it (emulator_slots.py: every task and every doit run of this
    user share them; a session holds its slot from when it has it, so the sessions' seconds, summed over them, over
    those that ran at once is their share of the wall time). Measured on YOLOv8n-320's w8a8 bundle (5 chips, 4
    samples): 8-12 s a chip alone; with both slots held by two other processes for 30 s, its first chip took 39.2 s,
    29 s of it waiting. A slow `doit dist` is most often that: its verify queued behind other tasks' emulator work.
    sessions: how many the check used (a small one runs its samples in this process: one)."""
    sessions = max(1, sessions)
    waited = seconds - session_seconds / min(emulator_slots.limit(), sessions)
    text = f"{seconds:.1f} s on {sessions} emulator session{'s' if sessions > 1 else ''}"
    if waited > max(5.0, seconds / 2):
        text += (f", about {waited:.0f} s of it waiting for a free emulator slot (the machine's "
                 f"{emulator_slots.limit()} were held by other work)")
    return text


def _check_targets(bundle: Path, index: dict, say) -> int:
    count = 0
    for chip, entry in index["chips"].items():
        for graph, graph_entry in index["graphs"].items():
            for name in (graph_entry.get("parts") and [p["binary"] for p in graph_entry["parts"]]) or [f"{graph}.bin"]:
                count += _check_target(bundle / chip / name, entry, chip, graph)
    say(f"{count} binaries: embedded SoC and arch match index.json")
    from .bundles.dist_parts import check_shared_targets
    shared = check_shared_targets(bundle, index)
    if shared:
        say(f"{shared} weight-shared context binaries: embedded SoC matches index.json")
    multi = index.get("multi_soc") or {}
    return _check_multi_soc_targets(bundle, index, multi, say, count)


def _check_target(binary: Path, entry: dict, chip: str, graph: str) -> int:
    from .toolchains.qnn_binary import read_binary_target
    if not binary.is_file():
        raise DistError(f"{binary}: missing (index.json lists chip {chip} and graph {graph})")
    target = read_binary_target(binary)
    if target["soc_type"] != entry["ro.soc.model"] or f"v{target['arch']}" != entry["dsp_arch"]:
        raise DistError(f"{binary}: built for soc_type={target['soc_type']} arch=v{target['arch']}, but "
                        f"index.json says {entry['ro.soc.model']} {entry['dsp_arch']}")
    return 1


def _check_multi_soc_targets(bundle: Path, index: dict, multi: dict, say, count: int) -> int:
    for graph, entry in (multi.get("graphs") or {}).items():
        binary = bundle / entry["binary"]
        records = multi_soc_records(binary)
        by_soc = {r["soc_model"]: r for r in records}
        for chip in multi["chips"]:
            soc, arch = index["chips"][chip]["soc_model"], index["chips"][chip]["dsp_arch"]
            record = by_soc.get(soc)
            if record is None or record["dsp_arch"] != arch:
                raise DistError(f"{binary}: no record for {chip} (soc_model {soc}, {arch}); it holds "
                                f"{[(r['record'], r['soc_model'], r['dsp_arch']) for r in records]}")
            record_io = record["graphs"].get(entry["qnn_graph"])
            if record_io is None:
                raise DistError(f"{binary}: record {record['record']} has no graph {entry['qnn_graph']}")
            difference = compare_record_io(record_io, index["graphs"][graph]["io"])
            if difference:
                raise DistError(f"{binary}: record {record['record']} ({chip}): {difference}")
        say(f"{binary.relative_to(bundle)}: one record per SoC ({', '.join(multi['chips'])}), each with the "
            "index's I/O contract")
    return count


def _try_multi_soc_on_emulator(bundle: Path, graph: str, entry: dict, index: dict, evaluation: dict,
                               samples: int | None, say, inputs: list[dict] | None = None) -> dict:
    """onnxruntime-qnn 2.7 (QNN 2.51) on x86 selects no record of a Flexible Context Binary ("Compatible cache not
    found"), so the emulator cannot run it: say so, and check the contract if some later version can."""
    ctx = bundle / entry["ctx_model"]
    try:
        measured = check_contract(ctx.parent, graph, index["graphs"][graph]["io"], Path(evaluation[graph]), samples,
                                  f"multi_soc/{graph}", ctx_name=ctx.name, binary_name=Path(entry["binary"]).name,
                                  inputs=inputs)
    except _EmulatorRefused as e:
        say(f"multi_soc/{graph}: not run: the x86 HTP emulator cannot load it ({e})")
        return {"ran": False, "error": str(e)}
    say(f"multi_soc/{graph}: I/O contract holds on the HTP emulator over {measured['samples']} samples")
    return {"ran": True, **measured}


def check_contract(chip_dir: Path, graph: str, contract: dict, evaluation: Path, samples: int | None, where: str,
                   ctx_name: str | None = None, binary_name: str | None = None,
                   inputs: list[dict] | None = None) -> dict:
    """Run `samples` evaluation inputs through the bare binary with the index's fixed-point I/O and through
    <graph>_ctx.onnx on float inputs; raise DistError naming the first output more than one step apart.
    inputs: the evaluation inputs already loaded (verify reads each graph's once for all chips)."""
    import numpy as np

    from .measuring.samples import load_evaluation

    ctx_path = chip_dir / (ctx_name or f"{graph}_ctx.onnx")
    binary = chip_dir / (binary_name or f"{graph}.bin")
    if inputs is None:
        inputs, _ = load_evaluation(str(evaluation), samples)
    if samples is not None:
        inputs = inputs[:samples]
    for tensor in contract["inputs"]:
        if inputs and tensor["name"] not in inputs[0]:
            raise DistError(f"{where}: index input '{tensor['name']}' is not in {evaluation} "
                            f"(it has {sorted(inputs[0])})")
    from .emulator import emulator_runs
    with tempfile.TemporaryDirectory(prefix="dist-verify-") as tmp:
        wrapper = _bare_binary_model(ctx_path, binary, contract, Path(tmp))
        feeds = [{t["name"]: np.asarray(sample[t["name"]]) for t in contract["inputs"]} for sample in inputs]
        worst = 0.0
        runs = emulator_runs.iter_results("build_rules.dist:open_contract_runs", (str(wrapper), str(ctx_path), contract,
                                                                                 where), feeds, "verify samples")
        # closed before the folder goes: a mismatch raised below ends the workers first (one still opening the
        # wrapper would find it gone, and onnxruntime print its own error above this one)
        with contextlib.closing(runs):
            for number, (raw, reference) in runs:
                for tensor in contract["outputs"]:
                    got = dequantize(raw[tensor["name"]], tensor)
                    want = np.asarray(reference[tensor["name"]], dtype=np.float64)
                    if got.shape != want.shape:
                        raise DistError(f"{where}: output '{tensor['name']}' has shape {list(got.shape)} from the "
                                        f"binary, {list(want.shape)} from {ctx_path.name}")
                    step = tensor["scale"] if tensor["scale"] is not None else \
                        1e-6 * max(1.0, float(np.abs(want).max()))
                    error = float(np.abs(got - want).max()) if got.size else 0.0
                    steps = error / step
                    if steps > 1.0 + 1e-6:
                        raise DistError(
                            f"{where}: I/O contract mismatch on output '{tensor['name']}' (sample {number}): the bare "
                            f"binary with the index's scale/offset differs from {ctx_path.name} by {error:.6g}, "
                            f"{steps:.1f} quantization steps of {step:.6g} (index: "
                            + ", ".join(f"{t['name']} {t['dtype']} scale {t['scale']} offset {t['offset']}"
                                        for t in [*contract["inputs"], tensor]) + ")")
                    worst = max(worst, steps)
    return {"samples": len(inputs), "worst_steps": worst}


def open_contract_runs(wrapper: str, ctx_path: str, contract: dict, where: str):
    """float sample -> (the bare binary's outputs on its fixed-point inputs, the _ctx.onnx's on the float ones): what
    each emulator worker of check_contract opens once (emulator_runs.iter_results), both through the output memo."""
    import numpy as np

    from .emulator.emulator_runs import open_binary
    try:
        run_bare = open_binary(wrapper, eager=True)
    except Exception as e:  # onnxruntime raises its own exception types
        raise _EmulatorRefused(f"{type(e).__name__}: {str(e).strip()[:400]}") from None
    run_float = open_binary(ctx_path)

    def run(sample: dict) -> tuple[dict, dict]:
        feed = {t["name"]: quantize(np.asarray(sample[t["name"]]), t) for t in contract["inputs"]}
        try:
            raw = run_bare(feed)
        except Exception as e:
            raise DistError(f"{where}: the binary refused inputs typed as the index says "
                            f"({', '.join(t['name'] + ' ' + t['dtype'] for t in contract['inputs'])}): "
                            f"{str(e).strip()[:400]}") from None
        return raw, run_float(sample)

    return run


def check_steps(chip_dir: Path, graph: str, entry: dict, evaluation: Path, steps: int, where: str) -> dict:
    """Run `steps` steps of a step graph from its first evaluation sample, as an app does: the bare binary with
    the state kept in the binary's own types (each state output written into its input as the index's `write`
    says, at the offset of a cache) and, side by side, <graph>_ctx.onnx with float state. Each step's outputs
    must agree within one quantization step and the greedy token (argmax of the index's logits) must be the
    same; raises DistError naming the step and output otherwise."""
    import numpy as np

    from .emulator.emulator_runs import holding_slot, open_binary
    from .measuring.samples import load_evaluation

    contract, step = entry["io"], entry["step"]
    ctx_path, binary = chip_dir / f"{graph}_ctx.onnx", chip_dir / f"{graph}.bin"
    reference_name = ctx_path.name if not entry.get("parts") else f"the chained {graph}.part<k>_ctx.onnx"
    inputs, _ = load_evaluation(str(evaluation))
    if not inputs:
        raise DistError(f"{where}: {evaluation} has no evaluation samples to step from")
    start = inputs[0]
    by_input = {t["name"]: t for t in contract["inputs"]}
    by_output = {t["name"]: t for t in contract["outputs"]}
    cache, greedy = step.get("cache"), step.get("greedy")
    fixed = {t["name"]: quantize(np.asarray(start[t["name"]]), t) for t in contract["inputs"]}
    floats = {t["name"]: np.array(start[t["name"]]) for t in contract["inputs"]}
    with holding_slot(), tempfile.TemporaryDirectory(prefix="dist-steps-") as tmp:
        if entry.get("parts"):  # a split step graph: its parts chained, fixed-point buffers passed on at each cut
            from .bundles.dist_parts import open_chains
            run_bare, run_float = open_chains(chip_dir, entry, Path(tmp))
        else:
            run_bare = open_binary(_bare_binary_model(ctx_path, binary, contract, Path(tmp)), eager=True)
            run_float = open_binary(ctx_path)
        worst, tokens = 0.0, []
        for number in range(steps):
            raw, reference = run_bare(fixed), run_float(floats)
            for tensor in contract["outputs"]:
                got = dequantize(raw[tensor["name"]], tensor)
                want = np.asarray(reference[tensor["name"]], dtype=np.float64)
                unit = tensor["scale"] if tensor["scale"] is not None else 1e-6 * max(1.0, float(np.abs(want).max()))
                apart = float(np.abs(got - want).max()) / unit if got.size else 0.0
                if apart > 1.0 + 1e-6:
                    raise DistError(f"{where}: greedy step {number}: output '{tensor['name']}' of the bare binary, "
                                    "its state fed back as the index's step.state says, differs from "
                                    f"{reference_name} by {apart:.1f} quantization steps of {unit:.6g}")
                worst = max(worst, apart)
            position = int(np.asarray(floats[cache["offset"]]).reshape(-1)[0]) if cache else None
            for link in step["state"]:
                out_t, in_t = by_output[link["output"]], by_input[link["input"]]
                value = raw[link["output"]] if link["same_encoding"] else \
                    quantize(dequantize(raw[link["output"]], out_t), in_t)
                _write(fixed, link["input"], np.asarray(value, dtype=fixed[link["input"]].dtype), cache, position)
                _write(floats, link["input"], np.asarray(reference[link["output"]], dtype=floats[link["input"]].dtype),
                       cache, position)
            if greedy:
                mine = int(dequantize(raw[greedy["logits"]], by_output[greedy["logits"]]).reshape(-1).argmax())
                theirs = int(np.asarray(reference[greedy["logits"]]).reshape(-1).argmax())
                if mine != theirs:
                    raise DistError(f"{where}: greedy step {number}: the bare binary chose token {mine}, "
                                    f"{reference_name} token {theirs}")
                tokens.append(mine)
                for state in (fixed, floats):
                    state[greedy["token"]] = np.full_like(state[greedy["token"]], mine)
            if cache:
                if position + 1 >= cache["length"]:
                    return {"steps": number + 1, "tokens": tokens, "worst_steps": worst}
                for state in (fixed, floats):
                    state[cache["offset"]] = np.full_like(state[cache["offset"]], position + 1)
                    if cache.get("mask"):
                        state[cache["mask"]].flat[position] = 0
    return {"steps": steps, "tokens": tokens, "worst_steps": worst}


def _write(state: dict, name: str, value, cache: dict | None, position: int | None) -> None:
    """A state output into its input: replace it, or with a cache write its one position at `position`."""
    if cache is None:
        state[name] = value.reshape(state[name].shape)
        return
    index = [slice(None)] * state[name].ndim
    index[cache["axis"]] = slice(position, position + 1)
    state[name][tuple(index)] = value


# --- summary -----------------------------------------------------------------------------------------------

def describe(index_path: str | os.PathLike) -> list[str]:
    """Summary lines for one bundle (the build summary of `doit dist`)."""
    try:
        index = json.loads(Path(index_path).read_text())
    except (OSError, ValueError):
        return [f"{index_path}: unreadable"]
    bundle = Path(index_path).parent
    per_chip = {chip: sum(size for f, size in entry["files"].items() if f.endswith(".bin"))
                for chip, entry in index["chips"].items()}
    lines = [f"bundle {bundle} ({len(index['chips'])} chip(s): {', '.join(index['chips'])}) -> "
             f"{bundle.parent / index['tarball']}"]
    from .toolchains.qnn_graph import describe as describe_float_ops
    floats = {}  # graph -> text -> chips: one line per graph and finding, not per chip
    for chip, entry in index["chips"].items():
        for graph, info in entry.get("float_ops", {}).items():
            if describe_float_ops(info):
                floats.setdefault(graph, {}).setdefault(describe_float_ops(info), []).append(chip)
    for graph, texts in floats.items():
        for text, chips in texts.items():
            lines.append(f"  {graph}: {text} on {', '.join(chips)}")
    for group, entry in ((index.get("shared_contexts") or {}).get("groups") or {}).items():  # [model] share_weights
        for chip, made in entry["chips"].items():
            lines.append(f"  shared context {group} on {chip}: {made['bytes'] / 1e6:.3f} MB for {', '.join(entry['graphs'])}"
                         f" (apart: {made['apart_bytes'] / 1e6:.3f} MB)"
                         + ("" if made["emulator"].get("loaded") else "; not loaded on the x86 emulator (checked apart)"))
    multi = index.get("multi_soc")
    if multi:
        if multi.get("error"):
            lines.append(f"  multi-SoC: not made: {multi['error']}")
        else:
            total = sum(g["bytes"] for g in multi["graphs"].values())
            chips_sum = sum(per_chip[c] for c in multi["chips"])
            lines.append(f"  multi-SoC: {total / 1e6:.3f} MB for {', '.join(multi['chips'])} "
                         f"(per-chip binaries: {chips_sum / 1e6:.3f} MB; {total / chips_sum:.2f} of it)")
            refused = [g for g, entry in multi["graphs"].items() if entry.get("emulator", {}).get("error")]
            if refused:  # QNN 2.51 on x86: "Compatible cache not found"
                lines.append(f"  multi-SoC: the x86 HTP emulator cannot load it ({', '.join(refused)}: "
                             f"{multi['graphs'][refused[0]]['emulator']['error'].rsplit('Error: ', 1)[-1]}); checked per SoC: record, "
                             "arch and I/O contract")
    return lines


# --- command line ------------------------------------------------------------------------------------------

DEFAULT_VERIFY_SAMPLES = 4  # [dist] verify_samples' default (config.py)


def _samples(text: str):
    if text == "all":
        return "all"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of samples (0: no emulator run) or 'all'") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of samples (0: no emulator run) or 'all'")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m build_rules.dist",
                                     description="Use a device bundle made by `doit dist` (out/<model>/dist/<variant>/).")
    commands = parser.add_subparsers(dest="command", required=True)
    s = commands.add_parser("select", help="print the chip folder a phone with this SoC loads")
    s.add_argument("bundle", type=Path)
    s.add_argument("--soc-model", required=True,
                   help="QNN's SoC model number (e.g. 69) or the phone's `getprop ro.soc.model` (e.g. SM8750)")
    s.add_argument("--json", action="store_true", help="print the chip's index entry as JSON too")
    v = commands.add_parser("verify", help="check files, binary targets and the I/O contract (HTP emulator)")
    v.add_argument("bundle", type=Path)
    v.add_argument("--evaluation", type=Path,
                   help="folder with <graph>.evaluation.npz (default: out/<model>/float/ beside the bundle)")
    v.add_argument("--samples", type=_samples, default=None,
                   help="evaluation samples per graph and chip, or 'all' (default: as many as `doit dist` checked, "
                        f"index.json's verify.samples; {DEFAULT_VERIFY_SAMPLES} for a bundle that does not say)")
    v.add_argument("--steps", type=int, default=VERIFY_STEPS,
                   help=f"greedy steps through a step graph with its state fed back (default {VERIFY_STEPS})")
    args = parser.parse_args(argv)
    try:
        if args.command == "select":
            index = read_index(args.bundle)
            chip = select_chip(index, args.soc_model)
            if chip is None:
                print(f"error: {fallback_message(index, args.soc_model, args.bundle)}", file=sys.stderr)
                return 2
            print(args.bundle / chip)
            if args.json:
                print(json.dumps({"chip": chip, **index["chips"][chip]}, indent=2, sort_keys=True))
            return 0
        index = read_index(args.bundle)
        evaluation = None
        if args.evaluation is not None:
            evaluation = {g: args.evaluation / f"{g}.evaluation.npz" for g in index.get("graphs", {})}
        samples = args.samples
        if samples is None:  # the stage's own check, not every sample (MTCNN w8a8: 4040 emulator runs, 10x longer)
            samples = (index.get("verify") or {}).get("samples", DEFAULT_VERIFY_SAMPLES)
        verify(args.bundle, evaluation, None if samples == "all" else samples, steps=args.steps)
        print(f"ok: {args.bundle} is what its index says")
        return 0
    except DistError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

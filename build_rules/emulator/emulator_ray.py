"""Emulator jobs on a Ray cluster: a binary's samples run as Ray tasks instead of on this machine (docs/ray.md).

emulator_runs.py asks configured() and, when a cluster is named, hands its job here. The binary's files (each
<graph>_ctx.onnx and the <graph>.bin it points at) go into Ray's object store once; the samples are cut into
contiguous chunks, one Ray task each (one CPU, plus one `emulator` unit when the cluster declares that resource),
and each task runs its chunk with the same opener the local run uses. The outputs come back in sample order. Only
this emulator work leaves the machine: everything else stays in doit here.

A worker first compares its onnxruntime-qnn with the version this build uses and refuses a mismatch (the emulator's
numbers differ between versions). A task lost with its node is retried by Ray (BUILD_RULES_RAY_RETRIES times);
when Ray gives up, or no node is left that can run it, the stage fails with an error naming the binary and the
cluster, and the runner keeps no half-written output (runner.py stages every target).

ray is an optional extra (`pip install 'ray[default]==2.60.*'`): it is imported only when a job goes to a cluster.
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

from ..errors import BuildError
from ..plumbing.env_settings import number

ADDRESS_ENV = "BUILD_RULES_RAY_ADDRESS"  # the tool's own setting; wins over Ray's RAY_ADDRESS
RETRIES_ENV = "BUILD_RULES_RAY_RETRIES"  # Ray's max_retries of each task (a lost node, a crashed worker)
NO_NODE_ENV = "BUILD_RULES_RAY_NO_NODE_SECONDS"  # how long a job waits while no node can run it
# Testing hook: the onnxruntime-qnn version the driver tells the workers to expect, instead of its own. The
# comparison itself runs on the worker (tests/test_ray.py makes it differ to see the refusal).
EXPECTED_VERSION_ENV = "BUILD_RULES_RAY_EXPECT_ORT_QNN"
RAY_INSTALL = "pip install 'ray[default]==2.60.*'"  # pyproject.toml's `ray` extra (a test checks they agree)
_OFF = {"", "off", "0", "no", "none", "false"}
_RESOURCE = "emulator"  # optional custom resource: nodes that declare it are the ones that run emulator tasks
_POLL_SECONDS = 5.0


def address() -> str | None:
    """The Ray cluster emulator jobs go to, or None (local workers): BUILD_RULES_RAY_ADDRESS, else RAY_ADDRESS;
    BUILD_RULES_RAY_ADDRESS=off keeps them local even when RAY_ADDRESS is set."""
    own = os.environ.get(ADDRESS_ENV)
    if own is not None:
        return None if own.strip().lower() in _OFF else own.strip()
    return os.environ.get("RAY_ADDRESS", "").strip() or None


def configured() -> bool:
    return address() is not None


def _setting() -> str:
    return ADDRESS_ENV if os.environ.get(ADDRESS_ENV) is not None else "RAY_ADDRESS"


def _int_env(name: str, default: int) -> int:
    return number(name, default, whole=True, least=0, what="a whole number >= 0", error=BuildError)


def preflight() -> None:
    """Fails at once, in one line, when the named cluster cannot be used: ray is not installed, or its host:port
    does not answer. emulator_runs calls it before the output memo reads the binary, so a configured but broken
    cluster says so on every run, not only on the runs where the memo lacks a sample. (Cheap: no ray.init; the
    connection itself is made by connect(), when samples are sent.)"""
    cluster = address()
    if cluster is None:
        return
    ray = _import_ray(cluster)
    if not (ray.is_initialized() and _connected_to == cluster):
        _reachable(cluster)


def _import_ray(cluster: str):
    try:
        import ray
    except ModuleNotFoundError:
        raise BuildError(f"{_setting()}={cluster} sends emulator runs to a Ray cluster, but the Python package ray "
                         f"is not installed: {RAY_INSTALL} (or unset {_setting()} to run them here)") from None
    return ray


def connect(cluster: str):
    """The ray module, connected to `cluster` (this process becomes a Ray driver); a clear error when ray is not
    installed or the cluster does not answer."""
    ray = _import_ray(cluster)
    global _connected_to
    if ray.is_initialized() and _connected_to != cluster:
        ray.shutdown()  # the setting changed within this process (a test, a bench): connect anew
    if not ray.is_initialized():
        import logging
        _reachable(cluster)
        try:
            ray.init(address=cluster, logging_level=logging.WARNING, log_to_driver=False)
        except Exception as e:  # ConnectionError, or ValueError for a malformed address
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise BuildError(f"cannot connect to the Ray cluster at {cluster} ({_setting()}): {first}; start it "
                             f"(`ray start --head`, docs/ray.md) or unset {_setting()} to run here") from None
        _connected_to = cluster
    return ray


_connected_to = None


def _reachable(cluster: str) -> None:
    """Fails at once when host:port does not answer: ray.init retries an unreachable address for minutes."""
    import socket
    host, _, port = cluster.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # "auto" and other forms Ray resolves itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as e:
        raise BuildError(f"cannot connect to the Ray cluster at {cluster} ({_setting()}): {e.strerror or e}; start "
                         f"it (`ray start --head`, docs/ray.md) or unset {_setting()} to run here") from None


# --- the driver: this machine ---------------------------------------------------------------------------------

def iter_outputs(ctx_model, inputs: list[dict], what: str, open_binary) -> Iterator[tuple[int, dict]]:
    """(index, outputs) for each sample in order, computed on the cluster; open_binary(ctx_model) -> feed ->
    outputs is the local run's opener, which each task calls on its copy of the files. Closing the iterator
    cancels the chunks not yet returned."""
    if not inputs:
        return
    cluster = address()
    ray = connect(cluster)
    files, local_model = _bundle(ctx_model)
    parts = [str(p) for p in ctx_model] if isinstance(ctx_model, (list, tuple)) else [str(ctx_model)]
    name = ", ".join(parts)  # for errors: every file of the binary
    resources = ray.cluster_resources()
    declared = _RESOURCE in resources
    chunks = _chunks(len(inputs), max(1, int(resources.get(_RESOURCE if declared else "CPU", 0))))
    task = ray.remote(_run_chunk).options(num_cpus=1, resources={_RESOURCE: 1} if declared else None,
                                          max_retries=_int_env(RETRIES_ENV, 3), name=f"emulator {Path(parts[0]).name}")
    # Put once: each node fetches the files once, whatever the number of chunks, and only a worker that has not
    # opened this binary yet (the reference travels in a list, so Ray does not fetch it before the task starts).
    binary = [ray.put(files), _digest(files)]
    nodes = sum(1 for node in ray.nodes() if node["Alive"] and node["Resources"].get(_RESOURCE if declared else "CPU"))
    print(f"{what}: {len(inputs)} in {len(chunks)} Ray task(s) on the cluster at {cluster} ({nodes} node(s))",
          flush=True)
    expected = os.environ.get(EXPECTED_VERSION_ENV) or _runtime_version()
    pending = [task.remote(binary, local_model, open_binary, [inputs[i] for i in chunk], expected) for chunk in chunks]
    done = 0

    def results():
        nonlocal done
        for chunk, ref in zip(chunks, pending):
            outputs = _wait(ray, ref, name, cluster, chunk, declared)
            done += 1
            yield from zip(chunk, outputs)

    try:
        yield from results()  # (emulator_runs counts them on its progress line)
    finally:
        for ref in pending[done:]:  # an early stop or an error: the rest is not wanted
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 -- already finished or already lost: nothing to cancel
                pass


def _bundle(ctx_model) -> tuple[dict[str, bytes], str | list[str]]:
    """The files a worker needs, {relative path: bytes}, and the ctx model(s) under those paths. Each part gets its
    own folder: the EPContext node names its .bin relative to the ctx model, as compile wrote it."""
    parts = list(ctx_model) if isinstance(ctx_model, (list, tuple)) else [ctx_model]
    files, models = {}, []
    for k, part in enumerate(parts):
        part = Path(part)
        files[f"{k}/{part.name}"] = part.read_bytes()
        for referenced in _referenced_files(part):
            files[f"{k}/{referenced}"] = (part.parent / referenced).read_bytes()
        models.append(f"{k}/{part.name}")
    return files, models if isinstance(ctx_model, (list, tuple)) else models[0]


def _referenced_files(ctx_model: Path) -> list[str]:
    """The files an EPContext model reads beside itself: its context binaries (embed_mode 0) and external data."""
    import onnx
    model = onnx.load(str(ctx_model), load_external_data=False)
    names = []
    for node in model.graph.node:
        if node.op_type != "EPContext":
            continue
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if attributes.get("embed_mode", 1) == 0:
            names.append(attributes["ep_cache_context"].decode())
    for tensor in model.graph.initializer:
        names += [entry.value for entry in tensor.external_data if entry.key == "location"]
    for name in names:
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise BuildError(f"{ctx_model} reads {name}, outside its folder: a Ray worker gets the files beside the "
                             "ctx model only; recompile it (compile writes the .bin beside it)")
    return sorted(set(names))


def _chunks(count: int, slots: int) -> list[range]:
    """count samples cut into at most `slots` contiguous chunks whose sizes differ by at most one."""
    parts = min(count, slots)
    bounds = [count * k // parts for k in range(parts + 1)] if parts else [0]
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


def _wait(ray, ref, name: str, cluster: str, chunk: range, declared: bool) -> list[dict]:
    """One chunk's outputs; a clear error when Ray gave up on it or when no node can run it any more."""
    resource = _RESOURCE if declared else "CPU"
    grace = _int_env(NO_NODE_ENV, 120)
    samples = f"samples {chunk.start}..{chunk.stop - 1}"
    no_node_since = None
    while not ray.wait([ref], timeout=min(_POLL_SECONDS, max(1, grace)))[0]:
        if ray.cluster_resources().get(resource, 0) > 0:
            no_node_since = None
            continue
        no_node_since = no_node_since or time.monotonic()
        if time.monotonic() - no_node_since >= grace:
            raise BuildError(f"the Ray cluster at {cluster} has had no live node offering the {resource!r} resource "
                             f"for {grace} s, so {name} ({samples}) cannot run: start a worker node (`ray start "
                             f"--address {cluster}`), wait longer ({NO_NODE_ENV}) or unset {_setting()} to run here")
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as e:  # the task's own error, raised on the worker
        cause = e.cause if e.cause is not None else e
        if isinstance(cause, BuildError):
            raise BuildError(str(cause)) from None
        raise cause from None
    except ray.exceptions.RayError as e:  # a lost node or worker, after Ray's retries
        detail = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise BuildError(f"the Ray cluster at {cluster} lost the emulator task of {name} ({samples}) and gave up "
                         f"after {_int_env(RETRIES_ENV, 3)} retries ({type(e).__name__}: {detail}): a node died or "
                         f"ran out of memory; `ray status --address {cluster}` shows the nodes left. Rerun the build "
                         f"(finished stages are kept), raise {RETRIES_ENV}, or unset {_setting()} to run here")
    # (a cancelled chunk is never waited on: cancelling happens only when the caller stopped reading)


def _digest(files: dict[str, bytes]) -> str:
    import hashlib
    digest = hashlib.sha256()
    for relative, data in sorted(files.items()):
        digest.update(relative.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


def _runtime_version() -> str | None:
    from ..plumbing.tool_versions import tool_version
    return tool_version("onnxruntime-qnn")


# --- the worker: a Ray task on some node --------------------------------------------------------------------------

_opened: dict = {}  # this worker process's last binary: the next chunk of the same job does not load it again


def _run_chunk(binary: list, local_model, open_binary, feeds: list[dict], expected: str | None) -> list[dict]:
    """Runs on a Ray worker: refuses another onnxruntime-qnn than the driver's, then runs the chunk.
    binary: [object ref of the files, their digest]."""
    _refuse_other_runtime(expected)
    files_ref, digest = binary
    if digest not in _opened:
        import tempfile

        import ray
        files = ray.get(files_ref)
        _opened.clear()
        # The files are read when the session opens, then removed: Ray ends its workers with SIGKILL, so a folder
        # kept for the worker's life was left in the node's /tmp by every worker of every build.
        with tempfile.TemporaryDirectory(prefix="build_rules-ray-") as folder:
            for relative, data in files.items():
                path = Path(folder, relative)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            model = ([str(Path(folder, m)) for m in local_model] if isinstance(local_model, list)
                     else str(Path(folder, local_model)))
            _opened[digest] = open_binary(model)
    run = _opened[digest]
    return [run(feed) for feed in feeds]


def _refuse_other_runtime(expected: str | None) -> None:
    found = _runtime_version()
    if found == expected:
        return
    import socket

    import ray
    node = f"{ray.util.get_node_ip_address()} ({socket.gethostname()}, node {ray.get_runtime_context().get_node_id()[:12]})"
    has = f"onnxruntime-qnn {found}" if found else "no onnxruntime-qnn"
    raise BuildError(f"Ray node {node} has {has}, but the build uses onnxruntime-qnn {expected}: install "
                     f"onnxruntime-qnn=={expected} on every worker node (the emulator's numbers differ between "
                     "versions; docs/ray.md)")

"""Emulator runs on a Ray cluster (build_rules/emulator/emulator_ray.py, docs/ray.md) against a REAL cluster that this module
starts on this machine (tests/ray_cluster.py): a head node and a second node from `ray start --address`, one CPU
and 200 MB each; the kill tests add a node of their own and SIGKILL it mid-job. No mock: the stages' emulator runs
go through the cluster's Ray tasks, and the numbers are compared with the local run's, byte for byte.
"""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from pathlib import Path

import pytest

from conftest import ROOT, run_doit

HAS_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not HAS_RAY, reason="ray is not installed (pip install 'ray[default]==2.60.*', the "
                                                   "`ray` extra): the Ray cluster tests need it")
CHECK = "check:tinynet/encoder/w8a16@SM8750"  # the reference chip's check: it measures in full
VARIANT_DIR = Path("out/tinynet/w8a16/SM8750")


# --- no cluster needed --------------------------------------------------------------------------------------------

def test_which_cluster(monkeypatch):
    from build_rules.emulator import emulator_ray
    monkeypatch.delenv("BUILD_RULES_RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert emulator_ray.address() is None and not emulator_ray.configured()
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")  # Ray's own variable (set inside `ray job submit`, too)
    assert emulator_ray.address() == "10.0.0.5:6379"
    monkeypatch.setenv("BUILD_RULES_RAY_ADDRESS", "10.0.0.7:6379")  # the tool's setting wins
    assert emulator_ray.address() == "10.0.0.7:6379"
    monkeypatch.setenv("BUILD_RULES_RAY_ADDRESS", "off")  # and can keep the emulator here despite RAY_ADDRESS
    assert emulator_ray.address() is None


def test_chunks_cover_every_sample_once_in_order():
    from build_rules.emulator.emulator_ray import _chunks
    assert _chunks(10, 3) == [range(0, 3), range(3, 6), range(6, 10)]
    assert _chunks(2, 8) == [range(0, 1), range(1, 2)]
    assert _chunks(0, 4) == []


def test_without_ray_a_one_line_error(tmp_path):
    """A cluster named, ray not importable: one line saying what to install, before the output memo reads the
    binary (here a file that does not exist). (ray is hidden by a `ray` package first on PYTHONPATH whose import
    fails as a missing one does.)"""
    shim = tmp_path / "no-ray" / "ray"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'ray'\", name='ray')\n")
    code = ("from build_rules.emulator import emulator_runs\n"
            "from build_rules.errors import BuildError\n"
            "try:\n    emulator_runs.run_outputs('model_ctx.onnx', [{}])\n"
            "except BuildError as e:\n    print(e)\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{shim.parent}:{ROOT}", "BUILD_RULES_RAY_ADDRESS": "10.0.0.7:6379"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == (
        "BUILD_RULES_RAY_ADDRESS=10.0.0.7:6379 sends emulator runs to a Ray cluster, but the Python package ray is "
        "not installed: pip install 'ray[default]==2.60.*' (or unset BUILD_RULES_RAY_ADDRESS to run them here)"), \
        done.stdout + done.stderr


def test_install_hint_is_the_extra():
    from build_rules.emulator.emulator_ray import RAY_INSTALL
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert RAY_INSTALL == f"pip install '{extras['ray'][0]}'"


@needs_ray
def test_a_cluster_that_does_not_answer_fails_at_once(monkeypatch):
    from s3_servers import free_port

    from build_rules.emulator import emulator_runs
    from build_rules.errors import BuildError
    import ray
    port = free_port()  # nothing listens there
    monkeypatch.setenv("BUILD_RULES_RAY_ADDRESS", f"127.0.0.1:{port}")

    def retrying(*args, **kwargs):  # ray.init retries such an address for minutes: "at once" is without it
        raise AssertionError("ray.init was called for an address that does not answer")
    monkeypatch.setattr(ray, "init", retrying)
    with pytest.raises(BuildError) as failure:  # (before the output memo reads the binary, which does not exist)
        emulator_runs.run_outputs("model_ctx.onnx", [{}])
    assert str(failure.value) == (
        f"cannot connect to the Ray cluster at 127.0.0.1:{port} (BUILD_RULES_RAY_ADDRESS): Connection refused; start "
        "it (`ray start --head`, docs/ray.md) or unset BUILD_RULES_RAY_ADDRESS to run here")


# --- a real cluster: head + one worker node, shared by the tests below ---------------------------------------------

@pytest.fixture(scope="module")
def cluster(request):
    if not HAS_RAY:
        pytest.skip("ray is not installed (pip install 'ray[default]==2.60.*', the `ray` extra)")
    import ray
    from ray_cluster import LocalCluster

    from build_rules.emulator import emulator_ray
    started = LocalCluster()
    request.addfinalizer(started.stop)
    request.addfinalizer(ray.shutdown)  # (finalizers run last-in first-out: the driver leaves, then the nodes go)
    emulator_ray.connect(started.address)  # this process is a driver on the head node (Ray prefers the head)
    started.add_node()
    started.wait_for_nodes(2)
    return started


@pytest.fixture
def on_cluster(cluster, monkeypatch):
    cluster.keep_first_nodes(2)  # head + the second node, whatever an earlier test that failed left
    for name in ("BUILD_RULES_RAY_RETRIES", "BUILD_RULES_RAY_NO_NODE_SECONDS", "BUILD_RULES_RAY_EXPECT_ORT_QNN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("BUILD_RULES_RAY_ADDRESS", cluster.address)
    monkeypatch.setenv("BUILD_RULES_CACHE", "off")  # a check must run, not come back from the build cache
    # and the emulator must run, not come back from the output memo (samples it has are not sent to the cluster:
    # test_the_memo_sends_only_what_it_lacks, the one test here with the memo on)
    monkeypatch.setenv("BUILD_RULES_EMULATOR_MEMO_MB", "0")
    return cluster


def test_a_check_through_ray_equals_the_local_one_byte_for_byte(on_cluster, tinynet_repo):
    """The reference chip's check measured again through the cluster: its report and measurement memo are the
    local build's, byte for byte (the emulator ran on the cluster: the stage's log says so)."""
    out = tinynet_repo / VARIANT_DIR
    local = {name: (out / name).read_bytes() for name in ("encoder.check.json", "encoder.measure.json")}
    for name in local:
        (out / name).unlink()  # no report, no memo: the emulator must run again
    left_before = set(Path(tempfile.gettempdir()).glob("build_rules-ray-*"))
    result = run_doit(tinynet_repo, CHECK)
    assert result.code == 0, result.output
    assert result.ran == {CHECK}
    assert {name: (out / name).read_bytes() for name in local} == local
    # the workers (still alive, their sessions open) left no copy of the binary in /tmp
    assert set(Path(tempfile.gettempdir()).glob("build_rules-ray-*")) <= left_before
    log = (out / "encoder.check.log").read_text()
    assert f"samples: 4 in 2 Ray task(s) on the cluster at {on_cluster.address} (2 node(s))" in log, log


def test_another_onnxruntime_qnn_on_a_worker_is_refused(on_cluster, tinynet_repo, monkeypatch):
    """The driver says which onnxruntime-qnn it expects (here, through the testing hook, one the workers do not
    have); the worker compares and refuses, naming both versions and the node. The stage fails like any stage and
    leaves neither its report nor a measurement."""
    from build_rules.plumbing.tool_versions import tool_version
    installed = tool_version("onnxruntime-qnn")
    monkeypatch.setenv("BUILD_RULES_RAY_EXPECT_ORT_QNN", "2.6.9")
    out = tinynet_repo / VARIANT_DIR
    for name in ("encoder.check.json", "encoder.measure.json"):
        (out / name).unlink()
    result = run_doit(tinynet_repo, CHECK)
    assert result.code != 0
    assert re.search(rf"Ray node [\d.]+ \(\S+, node [0-9a-f]{{12}}\) has onnxruntime-qnn {re.escape(installed)}, but "
                     r"the build uses onnxruntime-qnn 2\.6\.9: install onnxruntime-qnn==2\.6\.9 on every worker node "
                     r"\(the emulator's numbers differ between versions; docs/ray\.md\)", result.output), result.output
    assert not (out / "encoder.check.json").exists() and not (out / "encoder.measure.json").exists()


def test_a_chain_of_parts_through_ray_equals_the_local_run(on_cluster, built_tinynet, monkeypatch):
    """A split graph's parts go as one binary of several files (each part's ctx model and .bin in a folder of its
    own on the worker): here the tiny model's encoder then its head, a chain as chain.py runs one."""
    from build_rules.emulator import emulator_runs
    from build_rules.measuring.samples import load_evaluation
    parts = [str(built_tinynet / VARIANT_DIR / f"{graph}_ctx.onnx") for graph in ("encoder", "head")]
    inputs, _ = load_evaluation(str(built_tinynet / "out/tinynet/float/encoder.evaluation.npz"))
    remote = emulator_runs.run_outputs(parts, inputs)
    monkeypatch.setenv("BUILD_RULES_RAY_ADDRESS", "off")
    local = emulator_runs.run_outputs(parts, inputs)
    assert [sorted(sample) for sample in local] == [["logits"]] * len(inputs)
    assert len(remote) == len(local) and all(_same(a, b) for a, b in zip(remote, local))


def test_the_memo_sends_only_what_it_lacks(on_cluster, built_tinynet, monkeypatch, tmp_path, capsys):
    """The output memo first: the samples it has are not sent to the cluster, the ones that come back go in it, and
    a job it has in full does not touch the cluster. The numbers are the local run's."""
    from build_rules.emulator import emulator_runs
    ctx, inputs, local = _samples(built_tinynet, 1)
    monkeypatch.chdir(tmp_path)  # a memo of this test's own (out/.build-state/emulator-outputs under the cwd)
    monkeypatch.delenv("BUILD_RULES_EMULATOR_MEMO_MB")
    capsys.readouterr()
    first = emulator_runs.run_outputs(ctx, inputs[:2])
    said = capsys.readouterr().out
    assert "samples: 2 in 2 Ray task(s)" in said and "memo" not in said, said
    every = emulator_runs.run_outputs(ctx, inputs)
    said = capsys.readouterr().out
    assert "2 of 4 samples from the emulator output memo" in said and "samples: 2 in 2 Ray task(s)" in said, said
    again = emulator_runs.run_outputs(ctx, inputs)
    said = capsys.readouterr().out
    assert "all 4 samples from the emulator output memo" in said and "Ray task" not in said, said
    assert all(_same(a, b) for a, b in zip(first, local[:2]))
    assert all(_same(a, b) for a, b in zip(every, local)) and all(_same(a, b) for a, b in zip(again, local))


def test_a_cluster_that_does_not_answer_fails_even_when_the_memo_has_everything(on_cluster, built_tinynet,
                                                                                monkeypatch, tmp_path):
    """A cluster named but not answering is a setting to fix: the build says so on every run, not only on the runs
    where the memo lacks a sample."""
    from s3_servers import free_port

    from build_rules.emulator import emulator_runs
    from build_rules.errors import BuildError
    ctx, inputs, _ = _samples(built_tinynet, 1)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BUILD_RULES_EMULATOR_MEMO_MB")
    monkeypatch.setenv("BUILD_RULES_RAY_ADDRESS", "off")
    emulator_runs.run_outputs(ctx, inputs)  # now in the memo
    port = free_port()
    monkeypatch.setenv("BUILD_RULES_RAY_ADDRESS", f"127.0.0.1:{port}")
    with pytest.raises(BuildError, match=rf"^cannot connect to the Ray cluster at 127\.0\.0\.1:{port} "):
        emulator_runs.run_outputs(ctx, inputs)


# --- a node killed mid-job -----------------------------------------------------------------------------------------

def _samples(built_tinynet: Path, copies: int) -> tuple[str, list[dict], list[dict]]:
    """The tiny encoder's binary, its 4 evaluation samples repeated `copies` times (a job long enough to kill a
    node in), and the local run's outputs on the 4."""
    import os

    from build_rules.emulator import emulator_runs
    from build_rules.measuring.samples import load_evaluation
    ctx = str(built_tinynet / VARIANT_DIR / "encoder_ctx.onnx")
    inputs, _ = load_evaluation(str(built_tinynet / "out/tinynet/float/encoder.evaluation.npz"))
    address = os.environ.pop("BUILD_RULES_RAY_ADDRESS")
    try:
        local = emulator_runs.run_outputs(ctx, inputs)
    finally:
        os.environ["BUILD_RULES_RAY_ADDRESS"] = address
    return ctx, inputs * copies, local


def _run_with_a_node_killed(cluster, ctx: str, inputs: list[dict], resources: dict | None = None):
    """The job, with an extra node that is SIGKILLed as soon as one of its workers runs a chunk (as when its machine
    dies); returns the outputs, or the BuildError the job ended with. Afterwards the cluster has lost the node."""
    from build_rules.emulator import emulator_runs
    from build_rules.errors import BuildError
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    before = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    node = cluster.add_node(resources=resources)
    cluster.wait_for_nodes(3)
    # A task pinned to the new node first: the GCS seeing it alive is not the schedulers seeing its CPU free, and on
    # an idle machine the job's 3 chunks were once done by the 2 old nodes before any went to the new one (issue 46)
    new = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] not in before)

    def node_id():  # defined here: Ray ships it by value (the workers cannot import this test file)
        return ray.get_runtime_context().get_node_id()
    ray.get(ray.remote(node_id).options(num_cpus=1, scheduling_strategy=NodeAffinitySchedulingStrategy(
        new, soft=False)).remote(), timeout=120)
    killed, finished = threading.Event(), threading.Event()

    def watch():
        while not killed.is_set() and not finished.is_set():
            if cluster.workers_running(node):
                cluster.kill_node(node)
                killed.set()
            time.sleep(0.05)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        result = emulator_runs.run_outputs(ctx, inputs)
    except BuildError as e:
        result = e
    finally:
        finished.set()
        watcher.join()
        if not killed.is_set():
            cluster.kill_node(node)  # not left for the next test
    assert killed.is_set(), "the extra node never ran a chunk"
    cluster.wait_for_nodes(2)  # it is dead for the cluster too
    return result


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
                                        and a[k].tobytes() == b[k].tobytes() for k in a)


def test_a_node_killed_mid_job_is_retried_and_the_numbers_stay_exact(on_cluster, built_tinynet):
    ctx, inputs, local = _samples(built_tinynet, 600)
    outputs = _run_with_a_node_killed(on_cluster, ctx, inputs)  # 3 chunks of 800 samples, one per node
    assert isinstance(outputs, list), outputs
    assert len(outputs) == len(inputs)
    assert all(_same(out, local[i % len(local)]) for i, out in enumerate(outputs))


def test_when_ray_gives_up_a_clear_error(on_cluster, built_tinynet, monkeypatch):
    from build_rules.errors import BuildError
    ctx, inputs, _ = _samples(built_tinynet, 600)
    monkeypatch.setenv("BUILD_RULES_RAY_RETRIES", "0")
    failure = _run_with_a_node_killed(on_cluster, ctx, inputs)
    assert isinstance(failure, BuildError), "the job finished although its task was lost and no retry was allowed"
    assert re.fullmatch(
        rf"the Ray cluster at {re.escape(on_cluster.address)} lost the emulator task of {re.escape(ctx)} \(samples "
        r"\d+\.\.\d+\) and gave up after 0 retries \(\w+: .+\): a node died or ran out of memory; `ray status "
        rf"--address {re.escape(on_cluster.address)}` shows the nodes left\. Rerun the build \(finished stages are "
        r"kept\), raise BUILD_RULES_RAY_RETRIES, or unset BUILD_RULES_RAY_ADDRESS to run here", str(failure))


def test_when_no_node_is_left_a_clear_error(on_cluster, built_tinynet, monkeypatch):
    """Only a node that declares the `emulator` resource runs emulator tasks once the cluster has one; it dies
    mid-job, Ray would wait for another forever: the job fails after BUILD_RULES_RAY_NO_NODE_SECONDS."""
    from build_rules.errors import BuildError
    ctx, inputs, _ = _samples(built_tinynet, 300)
    monkeypatch.setenv("BUILD_RULES_RAY_NO_NODE_SECONDS", "2")
    failure = _run_with_a_node_killed(on_cluster, ctx, inputs, resources={"emulator": 1})
    assert isinstance(failure, BuildError), "the job finished without the only node that could run it"
    assert str(failure) == (
        f"the Ray cluster at {on_cluster.address} has had no live node offering the 'emulator' resource for 2 s, so "
        f"{ctx} (samples 0..1199) cannot run: start a worker node (`ray start --address {on_cluster.address}`), wait "
        "longer (BUILD_RULES_RAY_NO_NODE_SECONDS) or unset BUILD_RULES_RAY_ADDRESS to run here")

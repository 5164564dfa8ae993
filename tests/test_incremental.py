"""What re-runs after each kind of change (issue: the build graph). Each test starts from a fully
built copy of the tiny two-graph model (2 graphs x fp16/w8a16 x SM8550/SM8750) and asserts the
exact set of tasks that ran."""
from __future__ import annotations

import os
import re

import pytest

from conftest import run_doit

GRAPHS = ("encoder", "head")
VARIANTS = ("fp16", "w8a16")
CHIPS = ("SM8550", "SM8750")


def per_chip(stage, graphs=GRAPHS, variants=VARIANTS, chips=CHIPS):
    return {f"{stage}:tinynet/{g}/{v}@{c}" for g in graphs for v in variants for c in chips}


def packages(variants=VARIANTS, chips=CHIPS):
    return {f"package:tinynet/{v}@{c}" for v in variants for c in chips}


def test_second_run_runs_nothing(tinynet_repo):
    result = run_doit(tinynet_repo)
    assert result.code == 0, result.output
    assert result.ran == set()
    assert "package:tinynet/w8a16@SM8750" in result.up_to_date
    assert "summary: 0 task(s) ran, 38 up to date" in result.output


def test_a_no_op_build_writes_no_state(tinynet_repo):
    state = tinynet_repo / "out/.build-state"
    run_doit(tinynet_repo)  # settles the stat cache after the copy (new inodes)
    def stamps():  # the lock file is left out: it records which doit holds the repo
        return {p.name: p.stat().st_mtime_ns for p in state.iterdir() if p.suffix != ".lock"}
    before = stamps()
    assert {"doit.json", "stat-cache.json", "build.log"} <= set(before)
    assert run_doit(tinynet_repo).ran == set()
    assert stamps() == before


@pytest.mark.slow
def test_the_build_log_says_what_ran_and_how_long(tinynet_repo):
    from build_rules.build_log import read_build_log, seconds_per_stage
    log = tinynet_repo / "out/.build-state/build.log"
    import torch
    checkpoint = tinynet_repo / "models/tinynet/head.pt"
    state = torch.load(checkpoint, weights_only=True)
    name = next(iter(state))
    state[name] = state[name] + 0.01
    torch.save(state, checkpoint)
    ran = run_doit(tinynet_repo).ran
    rows = read_build_log(str(log), last_build=True)
    assert {task for _, _, _, task in rows} == ran
    assert {how for _, _, how, _ in rows} <= {"ran", "restored"}
    assert all(seconds >= 0 for _, seconds, _, _ in rows)
    assert seconds_per_stage(rows)["export"][0] == 1
    assert run_doit(tinynet_repo).ran == set()
    assert read_build_log(str(log), last_build=True) == rows  # a no-op adds nothing


def test_touching_a_checkpoint_without_changing_bytes_runs_nothing(tinynet_repo):
    checkpoint = tinynet_repo / "models/tinynet/encoder.pt"
    st = checkpoint.stat()
    os.utime(checkpoint, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert run_doit(tinynet_repo).ran == set()
    assert run_doit(tinynet_repo).ran == set()


@pytest.mark.slow
def test_changing_one_checkpoint_reruns_that_graphs_chain_only(tinynet_repo):
    import torch
    checkpoint = tinynet_repo / "models/tinynet/encoder.pt"
    state = torch.load(checkpoint, weights_only=True)
    state["conv1.bias"] = state["conv1.bias"] + 0.01
    torch.save(state, checkpoint)

    result = run_doit(tinynet_repo)
    assert result.code == 0, result.output
    expected = {"export:tinynet/encoder", "simplify:tinynet/encoder", "verify:tinynet/encoder", "calibrate:tinynet/encoder",
                "size:tinynet/encoder/fp16", "size:tinynet/encoder/w8a16", "calibration_stats:tinynet/encoder/minmax-8",
                "quantize:tinynet/encoder/w8a16", "fp16_lint:tinynet/encoder/fp16"}
    expected |= per_chip("compile", graphs=("encoder",)) | per_chip("check", graphs=("encoder",)) | packages()
    assert result.ran == expected
    assert not any("head" in t for t in result.ran)


def test_changing_one_variant_setting_reruns_that_variants_quantize_compile_check_package(tinynet_repo):
    toml = tinynet_repo / "models/tinynet/model.toml"
    text = toml.read_text()
    toml.write_text(text.replace('calibration = { method = "minmax", samples = 8 }',
                                 'calibration = { method = "minmax", samples = 6 }'))
    result = run_doit(tinynet_repo)
    assert result.code == 0, result.output
    expected = {f"quantize:tinynet/{g}/w8a16" for g in GRAPHS} | {f"calibration_stats:tinynet/{g}/minmax-6" for g in GRAPHS}
    expected |= per_chip("compile", variants=("w8a16",)) | per_chip("check", variants=("w8a16",))
    expected |= packages(variants=("w8a16",))
    assert result.ran == expected
    for stage in ("export", "simplify", "verify", "calibrate"):
        assert not result.ran_stage(stage)


@pytest.mark.slow
def test_changing_one_chip_entry_reruns_that_chips_compile_check_package(tinynet_repo):
    chips = tinynet_repo / "chips.toml"
    text = chips.read_text()
    block = re.search(r"\[chips\.SM8550\][^\[]*", text).group(0)
    chips.write_text(text.replace(block, block.replace("vtcm_mb = 8", "vtcm_mb = 4")))
    result = run_doit(tinynet_repo)
    assert result.code == 0, result.output
    expected = per_chip("compile", chips=("SM8550",)) | per_chip("check", chips=("SM8550",))
    expected |= packages(chips=("SM8550",))
    assert result.ran == expected

    # The reference chip's (SM8750): the other chips' checks compare with its binaries, so they run again too
    text = chips.read_text()
    block = re.search(r"\[chips\.SM8750\][^\[]*", text).group(0)
    chips.write_text(text.replace(block, block.replace("vtcm_mb = 8", "vtcm_mb = 4")))
    result = run_doit(tinynet_repo)
    assert result.code == 0, result.output
    expected = per_chip("compile", chips=("SM8750",)) | per_chip("check") | packages()
    assert result.ran == expected


def test_a_new_sdk_identity_reruns_every_sdk_stage_and_nothing_upstream(tinynet_repo, monkeypatch):
    from build_rules.toolchains import ort_qnn
    real = ort_qnn.identity

    def upgraded(cache_dir=None):
        return dict(real(cache_dir), package_version="2.8.0", build_id="v2.52.0.261101000000")

    monkeypatch.setattr(ort_qnn, "identity", upgraded)
    result = run_doit(tinynet_repo)
    assert result.code == 0, result.output
    assert result.ran == per_chip("compile") | per_chip("check") | packages()
    manifest = (tinynet_repo / "out/tinynet/w8a16/SM8550/manifest.json").read_text()
    assert "v2.52.0.261101000000" in manifest

    monkeypatch.setattr(ort_qnn, "identity", real)  # back to the installed SDK: SDK stages again only
    assert run_doit(tinynet_repo).ran == per_chip("compile") | per_chip("check") | packages()


def test_one_chip_group_builds_only_that_chip(tinynet_repo):
    import shutil
    shutil.rmtree(tinynet_repo / "out/tinynet/fp16")
    shutil.rmtree(tinynet_repo / "out/tinynet/w8a16/SM8550")
    result = run_doit(tinynet_repo, "SM8750")
    assert result.code == 0, result.output
    # out/tinynet/fp16 held the chip-independent fp16 lint and size check reports too: they run again, once per graph
    assert result.ran == per_chip("compile", variants=("fp16",), chips=("SM8750",)) \
        | per_chip("check", variants=("fp16",), chips=("SM8750",)) | packages(variants=("fp16",), chips=("SM8750",)) \
        | {f"{stage}:tinynet/{g}/fp16" for g in GRAPHS for stage in ("fp16_lint", "size")}
    assert not (tinynet_repo / "out/tinynet/w8a16/SM8550").exists()


@pytest.mark.slow
def test_chip_without_fp16_skips_fp16_variants_with_a_note(tmp_path):
    from conftest import TEST_MODELS, make_repo, write_tinynet_checkpoints
    repo = make_repo(tmp_path / "repo", {"tinynet": TEST_MODELS / "tinynet"})
    write_tinynet_checkpoints(repo / "models/tinynet")
    toml = repo / "models/tinynet/model.toml"
    toml.write_text(toml.read_text().replace('chips = ["SM8550", "SM8750"]', 'chips = ["SM8350", "SM8750"]'))
    listing = run_doit(repo, "list", "--all").output
    assert "compile:tinynet/encoder/w8a16@SM8350" in listing
    assert "compile:tinynet/encoder/fp16@SM8750" in listing
    assert "fp16@SM8350" not in listing
    result = run_doit(repo, "export")
    assert result.code == 0, result.output
    assert "note: tinynet/fp16@SM8350: skipped, SM8350 (v68) has no fp16 support" in result.output


def test_an_output_edited_by_hand_is_detected_by_content_and_rebuilt(tinynet_repo):
    binary = tinynet_repo / "out/tinynet/w8a16/SM8750/encoder.bin"
    good = binary.read_bytes()
    binary.write_bytes(good[: len(good) // 2])  # truncated
    report = tinynet_repo / "out/tinynet/fp16/SM8550/head.check.json"
    report.write_text(report.read_text().replace('"samples"', '"samples_edited"'))  # edited, same folder
    result = run_doit(tinynet_repo)
    assert result.code == 0, result.output
    assert result.ran == {"compile:tinynet/encoder/w8a16@SM8750", "check:tinynet/head/fp16@SM8550"}
    assert binary.read_bytes() == good
    assert run_doit(tinynet_repo).ran == set()


def test_touching_an_output_without_changing_it_runs_nothing(tinynet_repo):
    binary = tinynet_repo / "out/tinynet/w8a16/SM8750/encoder.bin"
    st = binary.stat()
    os.utime(binary, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert run_doit(tinynet_repo).ran == set()


def test_task_actions_pickle_for_process_workers(tinynet_repo, monkeypatch):
    """`doit -n N` without `-P thread` pickles each task's actions (with their lazy keys) to its workers."""
    import pickle
    from build_rules.tasks import pipeline as tasks
    monkeypatch.chdir(tinynet_repo)
    tasks.project.cache_clear()
    try:
        made = list(tasks._compile_tasks()) + list(tasks._quantize_tasks())
        for task in made:
            cache = task["actions"][0][2]
            copy = pickle.loads(pickle.dumps(task["actions"]))[0][2]
            assert copy["cache_key"].digest == cache["cache_key"].digest
            assert pickle.loads(pickle.dumps(task["uptodate"][0])).digest == task["uptodate"][0].digest
    finally:
        tasks.project.cache_clear()
    from build_rules.build_state.hashing import TaskKey
    key = TaskKey({"stage": "qairt-convert", "params": {"x": 1}})  # the qairt toolchain passes the dict itself
    assert pickle.loads(pickle.dumps(key)).digest == key.digest

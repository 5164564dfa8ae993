"""Weight-shared contexts ([model] share_weights, docs/split.md): a prompt graph and a step graph of one module in one
context binary that stores their weights once, with onnxruntime-qnn (ep.share_ep_contexts) and with the stand-in
QAIRT SDK's DLC flow (one --dlc_path list, weight_sharing_enabled in the HTP config)."""
from __future__ import annotations

import json
import runpy
import shutil

import pytest

from conftest import TEST_MODELS, make_repo, run_doit

GROUP = "prompt+step"


def write_checkpoint(folder, seed: int = 0) -> None:
    import torch
    torch.manual_seed(seed)
    torch.save(runpy.run_path(str(folder / "hooks.py"))["module"]()().state_dict(), folder / "mlp.pt")


@pytest.fixture(scope="module")
def shared_build(tmp_path_factory):
    repo = make_repo(tmp_path_factory.mktemp("shared"), {"shared": TEST_MODELS / "shared"})
    write_checkpoint(repo / "models/shared")
    result = run_doit(repo, "dist")
    assert result.code == 0, result.output
    return repo, result


@pytest.mark.slow
def test_two_graphs_sharing_weights_get_one_binary_and_the_index_says_so(shared_build):
    import onnx

    from build_rules import dist
    repo, result = shared_build
    assert f"shared_context:shared/{GROUP}/w8a16@SM8750" in result.ran
    folder = repo / "out/shared/w8a16/SM8750/shared"
    report = json.loads((folder / f"{GROUP}.json").read_text())
    apart = [(repo / f"out/shared/w8a16/SM8750/{g}.bin").stat().st_size for g in ("prompt", "step")]
    assert report["apart_bytes"] == sum(apart)
    # fc1 and fc2 (64 x 256 each, uint8 weights) stored once: the shared file is much smaller than the two apart
    assert report["bytes"] == (folder / f"{GROUP}.bin").stat().st_size < 0.8 * sum(apart), report
    assert report["shared_weights"]["count"] >= 2
    for graph in ("prompt", "step"):
        ctx = onnx.load(str(folder / f"{graph}_ctx.onnx"))
        ep = next(n for n in ctx.graph.node if n.op_type == "EPContext")
        assert {a.name: a.s for a in ep.attribute}["ep_cache_context"] == f"{GROUP}.bin".encode()
        assert [i.name for i in ctx.graph.input] == ["x"] and [o.name for o in ctx.graph.output] == ["y"]
    assert report["emulator"]["loaded"] is False and report["emulator"]["error"]
    index = json.loads((repo / "out/shared/dist/w8a16/index.json").read_text())
    entry = index["shared_contexts"]["groups"][GROUP]
    assert entry["graphs"] == ["prompt", "step"]
    chip = entry["chips"]["SM8750"]
    assert chip["binary"] == f"SM8750/shared/{GROUP}.bin" and chip["bytes"] == report["bytes"]
    assert chip["emulator"]["loaded"] is False
    assert set(chip["graphs"]) == {"prompt", "step"}
    assert chip["graphs"]["step"]["io"]["outputs"][0]["name"] == "y"
    assert chip["graphs"]["step"]["io"]["outputs"][0]["qnn_name"].startswith("step__")  # unique inside the context
    lines = []
    dist.verify(repo / "out/shared/dist/w8a16", samples=1, say=lines.append)
    assert "1 weight-shared context binaries: embedded SoC matches index.json" in lines


def test_the_shared_binary_is_the_same_bytes_when_made_again(shared_build, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(shared_build[0], repo, symlinks=True)
    binary = repo / f"out/shared/w8a16/SM8750/shared/{GROUP}.bin"
    before = binary.read_bytes()
    forget = run_doit(repo, "forget", f"shared_context:shared/{GROUP}/w8a16@SM8750")
    assert forget.code in (0, None)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BUILD_RULES_CACHE", "off")  # compiled again, not restored from the build cache
        again = run_doit(repo, f"shared_context:shared/{GROUP}/w8a16@SM8750")
    assert again.code == 0 and again.ran == {f"shared_context:shared/{GROUP}/w8a16@SM8750"}, again.output
    assert binary.read_bytes() == before


def test_graphs_that_share_no_weights_fail_naming_them(tinynet_repo):
    toml = tinynet_repo / "models/tinynet/model.toml"
    toml.write_text(toml.read_text().replace('chips = ["SM8550", "SM8750"]',
                                             'chips = ["SM8550", "SM8750"]\nshare_weights = [["encoder", "head"]]'))
    result = run_doit(tinynet_repo, "shared_context:tinynet/encoder+head/w8a16@SM8750")
    assert result.code != 0
    assert ("shared_context:tinynet/encoder+head/w8a16@SM8750: graphs encoder, head share no weights (no initializer "
            "with the same value in") in result.output


@pytest.mark.parametrize("value, message", [
    ('[["prompt"]]', "expected groups of two or more graph names"),
    ('[["prompt", "decoder"]]', "no graph 'decoder' (graphs: prompt, step)"),
    ('[["prompt", "step"], ["step", "prompt"]]', "graph 'step' is in two groups"),
])
def test_share_weights_config_errors_name_the_key(tmp_path, value, message):
    repo = make_repo(tmp_path / "repo", {"shared": TEST_MODELS / "shared"})
    (repo / "models/shared/mlp.pt").write_bytes(b"")
    toml = repo / "models/shared/model.toml"
    toml.write_text(toml.read_text().replace('share_weights = [["prompt", "step"]]', f"share_weights = {value}"))
    result = run_doit(repo, "list")
    assert result.code == 3
    assert f"models/shared/model.toml: [model] share_weights: {message}" in result.output


def test_the_qairt_dlc_flow_compiles_the_group_into_one_context(shared_build, tmp_path, monkeypatch):
    from fake_qairt.make_sdk import make_sdk
    from test_qairt_toolchain import VERSION, recorded, use_sdk
    repo = tmp_path / "repo"
    shutil.copytree(shared_build[0], repo, symlinks=True)
    shutil.rmtree(repo / "out/shared/w8a16")
    sdk = make_sdk(tmp_path / "qairt" / VERSION, net_run=True)
    calls = tmp_path / "calls.jsonl"
    use_sdk(monkeypatch, sdk, calls, host_tools=False)
    monkeypatch.setenv("BUILD_RULES_QAIRT_FLOW", "dlc")
    result = run_doit(repo, f"shared_context:shared/{GROUP}/w8a16@SM8750")
    assert result.code == 0, result.output
    generator = [c for c in recorded(calls, "qnn-context-binary-generator") if f"{GROUP}" in " ".join(c)]
    assert len(generator) == 1
    argv = generator[0]
    assert argv[argv.index("--dlc_path") + 1] == "out/shared/w8a16/prompt.dlc,out/shared/w8a16/step.dlc"
    folder = repo / "out/shared/w8a16/SM8750/shared"
    report = json.loads((folder / f"{GROUP}.json").read_text())
    config = report["htp_config"]  # what the generator read
    assert config["context"] == {"weight_sharing_enabled": True}
    assert config["graphs"][0]["graph_names"] == ["prompt", "step"]
    assert sorted(report["graphs"]) == ["prompt", "step"]
    assert [t["name"] for t in report["graphs"]["step"]["io"]["inputs"]] == ["x"]


def test_the_stand_in_generator_refuses_a_dlc_list_its_config_does_not_name(tmp_path):
    """The stand-in checks the new flags as strictly as the real tool: every graph of a --dlc_path list must be
    in the HTP config's graph_names, and the context config takes only weight_sharing_enabled, a bool."""
    import os
    import subprocess

    from fake_qairt.make_sdk import make_sdk
    from fake_qairt import tools
    from test_qairt_toolchain import VERSION
    sdk = make_sdk(tmp_path / "qairt" / VERSION, net_run=True)
    for name in ("a", "b"):
        tools._write_dlc(tmp_path / f"{name}.dlc", {"graph": name, "inputs": [], "outputs": [], "nodes": []})
    config = {"graphs": [{"vtcm_mb": 8, "O": 3, "graph_names": ["a"]}],
              "devices": [{"device_id": 0, "soc_id": 69, "dsp_arch": "v79", "cores": []}],
              "context": {"weight_sharing_enabled": "yes"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "ext.json").write_text(json.dumps({"backend_extensions": {
        "shared_library_path": str(sdk / "lib/x86_64-linux-clang/libQnnHtpNetRunExtensions.so"),
        "config_file_path": str(tmp_path / "config.json")}}))
    from build_rules.toolchains import qairt
    sdk_obj = qairt.Sdk(sdk)
    cmd = qairt.context_binary_command(sdk_obj, str(tmp_path / "out"), "ab", str(tmp_path / "ext.json"),
                                       dlc=[str(tmp_path / "a.dlc"), str(tmp_path / "b.dlc")])
    env = qairt.tool_env(sdk_obj, dict(os.environ))

    def run():
        return subprocess.run(cmd, env=env, capture_output=True, text=True)
    refused = run()
    assert refused.returncode != 0 and "context.weight_sharing_enabled must be true or false" in refused.stdout + refused.stderr
    config["context"]["weight_sharing_enabled"] = True
    (tmp_path / "config.json").write_text(json.dumps(config))
    refused = run()
    assert refused.returncode != 0 and "graph b is not in graph_names ['a']" in refused.stdout + refused.stderr
    config["graphs"][0]["graph_names"] = ["a", "b"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    made = run()
    assert made.returncode == 0, made.stdout + made.stderr
    assert json.loads((tmp_path / "out/ab.bin").read_bytes().split(b"// meta: ")[1])["weight_sharing"] is True

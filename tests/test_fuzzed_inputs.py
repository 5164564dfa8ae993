"""No input crashes the tool: property-based tests (Hypothesis) that mutate model.toml, chips.toml and ONNX files.

For every case: the load either accepts the input or ends with a one-line error that names the file and the key (or
the tensor / node), never a Python traceback; nothing is written outside out/; a refused case leaves no partial output;
once the file is put back, the repo builds again (a no-op `doit`, or `doit simplify` for the ONNX model).

Cases (fixed: derandomize=True, so CI runs the same ones every time; Hypothesis 6.155.2, pinned in the `test` extra):
- model.toml of the tiny test model, 300 cases, and chips.toml, 150 cases, each planned in this process the way `doit
  list` plans (the config, every task generator, doit's task graph: ~20 ms a case instead of a ~1 s process; any
  exception but the config's ConfigError fails the case, since `doit list` would print it as a traceback). 1-3
  mutations a case, each one of: a key deleted; an unknown key added; a value replaced by one of another type
  (nested lists and tables too); a table renamed (graph, variant, input names: unicode, slashes, dots, empty, control
  and direction characters, reserved task and chip names); numbers at the edges (0, negative, 2**63, 10**30, 1e308,
  inf, nan); odd paths for hooks / checkpoints / onnx (absolute, `..`, NUL, `pkg:` forms); unicode strings; or, in
  one case in ten, the file cut short or a byte made invalid UTF-8. Most are refused (274-278 of 300 and 132 of 150 in
  the runs so far; test_most_mutants_are_refused checks that the mutations reach the checks). A mutant that is
  accepted is planned, not built (a build per case would cost minutes).
- ONNX files, 12 kinds x 6 cases, through the simplify stage in this process: truncated bytes, a wrong or missing
  opset, dynamic dims, int64 inputs and outputs, an initializer removed, an unknown op, a node reading a tensor
  nothing makes, an empty graph, an output with no producer, element types HTP has no form for.
- 7 real `doit` processes for what only a process shows: a byte that is not UTF-8 (`doit list`), a number out of range
  and a chips.toml value of the wrong type (`doit`), each one line and exit code 3 with out/ untouched, then a no-op;
  a truncated ONNX file and an int64 output (`doit`: simplify fails with one line, nothing staged or half-written),
  then the good file builds (`doit simplify`).
"""
from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ROOT, make_repo

FUZZ = settings(derandomize=True, database=None, deadline=None, print_blob=False,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


# --- TOML written back from a document (tomllib reads it; Hypothesis edits dicts) -----------------------------------

BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _string(text: str) -> str:
    out = []
    for ch in text:
        if ch in '"\\' or ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _key(key: str) -> str:
    return key if BARE_KEY.match(key) else _string(key)


def _value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value:
            return "nan"
        if value in (float("inf"), float("-inf")):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


def toml_text(doc: dict) -> str:
    """One `key = value` line per top-level key (tables as inline tables): what tomllib reads back as `doc`."""
    return "".join(f"{_key(k)} = {_value(v)}\n" for k, v in doc.items())


# --- mutations -----------------------------------------------------------------------------------------------------

ODD_NAMES = ["", ".", "..", "a/b", "../up", "a b", "é", "模型", "x" * 300, "float", "calibration", "tuning", "dist",
             "report", "export", "SM8750", "con", "-", "_", "a.b", "tab\there", "nul\x00", "\u202e"]
ODD_PATHS = ["", "/", "/etc/passwd", "../../x.pt", "missing.pt", "hooks.py/..", "a\x00b.pt", "pkg:", "pkg:/x",
             "pkg:nonexistent_pkg_zz/x.pt", "pkg:os/../../etc/passwd", "pkg:build_rules", "pkg:build_rules/",
             "~/x.pt", "C:\\x.pt", "." * 5, "model.toml", "encoder.pt\n", "ü.pt"]
EDGE_NUMBERS = [0, -1, 1, 2**31, 2**63, -2**63, 10**30, -10**30, 1e308, -1e308, float("inf"), float("-inf"),
                float("nan"), -0.0, 0.5, 1e-300]

scalars = st.one_of(st.integers(min_value=-2**70, max_value=2**70), st.sampled_from(EDGE_NUMBERS), st.booleans(),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                    st.sampled_from(ODD_NAMES + ODD_PATHS))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(st.sampled_from(["a", "shape", "dtype", "x", "é"]),
                                                                        inner, max_size=3)), max_leaves=6)
names = st.one_of(st.sampled_from(ODD_NAMES), st.text(min_size=0, max_size=8))


def key_paths(node, prefix=()):
    """Every key and list item in a document, as paths of keys / indices."""
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for key, value in items:
        yield prefix + (key,)
        if isinstance(value, (dict, list)):
            yield from key_paths(value, prefix + (key,))


def _parent(doc, path):
    node = doc
    for key in path[:-1]:
        node = node[key]
    return node


def mutate(doc: dict, data) -> tuple[dict, list[str]]:
    """1-3 random mutations of a copy of doc; what was done, for the failure message."""
    doc = copy.deepcopy(doc)
    done = []
    for _ in range(data.draw(st.integers(1, 3))):
        paths = list(key_paths(doc))
        if not paths:
            break
        path = data.draw(st.sampled_from(paths))
        parent, key = _parent(doc, path), path[-1]
        kinds = ["delete", "retype", "number", "path", "unicode"]
        if isinstance(parent, dict):
            kinds.append("rename")
        if isinstance(parent[key], dict):
            kinds.append("unknown key")
        kind = data.draw(st.sampled_from(kinds))
        if kind == "delete":
            del parent[key]
        elif kind == "retype":
            parent[key] = data.draw(values)
        elif kind == "number":
            parent[key] = data.draw(st.sampled_from(EDGE_NUMBERS))
        elif kind == "path":
            parent[key] = data.draw(st.sampled_from(ODD_PATHS))
        elif kind == "unicode":
            parent[key] = data.draw(st.text(min_size=1, max_size=20))
        elif kind == "rename":
            new = data.draw(names)
            items = list(parent.items())
            parent.clear()
            parent.update((new if k == key else k, v) for k, v in items)
        else:
            parent[key][data.draw(names)] = data.draw(values)
        done.append(f"{kind} {'.'.join(map(str, path))}")
    return doc, done


def file_mutation(text: str, data) -> tuple[bytes, str]:
    """Text-level damage: cut short, or one byte that is not UTF-8."""
    raw = text.encode()
    at = data.draw(st.integers(0, len(raw)))
    if data.draw(st.booleans()):
        return raw[:at], f"cut at byte {at}"
    return raw[:at] + b"\xff" + raw[at:], f"0xff at byte {at}"


# --- what every case must satisfy ----------------------------------------------------------------------------------

def tree(folder: Path, skip_out: bool) -> dict[str, tuple[int, int]]:
    """path -> (size, mtime_ns) of every file outside out/ (skip_out), or under out/ but doit's own state and logs."""
    files = {}
    for top, dirs, names in os.walk(folder):
        rel = os.path.relpath(top, folder)
        if rel == ".":
            rel = ""
            if skip_out and "out" in dirs:
                dirs.remove("out")
        if not skip_out and ".build-state" in dirs:
            dirs.remove(".build-state")
        for name in names:
            if not skip_out and name.endswith(".log"):
                continue
            st_ = os.stat(os.path.join(top, name))
            files[os.path.join(rel, name)] = (st_.st_size, st_.st_mtime_ns)
    return files


def plan_in_process(repo: Path) -> int:
    """What `doit list` does with the build file, in this process: the config (project(), which doit_config() runs
    and whose ConfigError it prints as `error: <message>`), every task generator of dodo.py, and doit's task graph.
    Returns the number of tasks. Any exception but a ConfigError from the config is a crash the subprocess would print
    as a traceback."""
    from doit.control import TaskControl
    from doit.loader import generate_tasks

    from build_rules import tasks
    old = os.getcwd()
    os.chdir(repo)
    tasks.project.cache_clear()
    try:
        tasks.project()
        made = []
        for name in tasks.__all__:
            if name.startswith("task_"):
                creator = getattr(tasks, name)
                made += generate_tasks(name[len("task_"):], creator(), creator.__doc__)
        TaskControl(made)
        return len(made)
    finally:
        os.chdir(old)
        tasks.project.cache_clear()


def assert_one_line_error(message: str, files: tuple[str, ...], what):
    """`<file>: <table and/or key>: <message>` on one line, the file one of `files`."""
    assert "\n" not in message and "Traceback" not in message, (what, message)
    prefix = next((f"{f}: " for f in files if message.startswith(f"{f}: ")), None)
    assert prefix, (what, message)
    place, _, rest = message[len(prefix):].partition(": ")
    assert place and rest, (what, message)  # e.g. `[graphs.head] calibration_samples`, `invalid TOML`


def check_config_case(repo: Path, target: Path, content: bytes, what, files: tuple[str, ...]) -> str | None:
    """Write the mutant, plan in-process, put the file back: accepted (None) or refused with a one-line error naming
    the file and key (the message); nothing written outside out/, nothing under out/ written or removed."""
    from build_rules.configuration.config import ConfigError
    original = target.read_bytes()
    outside, inside = tree(repo, skip_out=True), tree(repo / "out", skip_out=False)
    target.write_bytes(content)
    try:
        try:
            plan_in_process(repo)
            message = None
        except ConfigError as e:
            message = str(e)
            assert_one_line_error(message, files, what)
        assert tree(repo / "out", skip_out=False) == inside, what
        after = tree(repo, skip_out=True)
        rel = str(target.relative_to(repo))
        assert {k: v for k, v in after.items() if k != rel} == {k: v for k, v in outside.items() if k != rel}, what
    finally:
        target.write_bytes(original)
    return message


@pytest.fixture(scope="module")
def fuzz_repo(built_tinynet, tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("fuzz") / "repo"
    shutil.copytree(built_tinynet, repo, symlinks=True)
    return repo


def toml_mutant(text: str, data) -> tuple[bytes, list[str]]:
    if data.draw(st.integers(0, 9), label="file-level") == 0:
        content, what = file_mutation(text, data)
        return content, [what]
    doc, what = mutate(tomllib.loads(text), data)
    return toml_text(doc).encode(), what


MODEL_TOML_CASES = 300
CHIPS_TOML_CASES = 150
refused = {"model.toml": 0, "chips.toml": 0}  # counted for the docstring's numbers (printed with -s)


@settings(FUZZ, max_examples=MODEL_TOML_CASES)
@given(data=st.data())
def test_model_toml_mutations(fuzz_repo, data):
    toml = fuzz_repo / "models/tinynet/model.toml"
    content, what = toml_mutant(toml.read_text(), data)
    if check_config_case(fuzz_repo, toml, content, what, ("models/tinynet/model.toml",)):
        refused["model.toml"] += 1


@settings(FUZZ, max_examples=CHIPS_TOML_CASES)
@given(data=st.data())
def test_chips_toml_mutations(fuzz_repo, data):
    chips = fuzz_repo / "chips.toml"
    content, what = toml_mutant(chips.read_text(), data)
    # a chips.toml mistake may surface as the model's (e.g. its chip no longer exists)
    if check_config_case(fuzz_repo, chips, content, what, ("chips.toml", "models/tinynet/model.toml")):
        refused["chips.toml"] += 1


def test_most_mutants_are_refused():
    """The mutations reach the checks: most cases are refused (a strategy that only made valid files would pass
    the properties above without testing them). Runs after the two tests above (file order)."""
    if refused["model.toml"] == 0 and refused["chips.toml"] == 0:
        pytest.skip("run with the mutation tests")
    print(f"refused: {refused} of {MODEL_TOML_CASES} model.toml and {CHIPS_TOML_CASES} chips.toml mutants")
    assert refused["model.toml"] >= MODEL_TOML_CASES // 2 and refused["chips.toml"] >= CHIPS_TOML_CASES // 3, refused


# --- ONNX files ----------------------------------------------------------------------------------------------------

ONNX_HOOKS = '''import numpy as np
def evaluation_inputs(graph):
    rng = np.random.default_rng(0)
    return [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(2)]
'''
ONNX_MODEL_TOML = '''[model]
onnx = "model.onnx"
hooks = "hooks.py"
chips = ["SM8550"]

[graphs.net]
inputs = { x = { shape = [1, 3, 8, 8], dtype = "float32" } }
outputs = ["y"]

[variants.fp16]
precision = "fp16"
'''
ONNX_KINDS = ("truncated", "opset", "no opset", "dynamic dim", "int64 input", "int64 output", "no initializer",
              "unknown op", "dangling input", "empty graph", "unproduced output", "undefined dtype")


def conv_relu():
    """x[1,3,8,8] -> Conv (weight w, bias b) -> Relu -> y[1,4,8,8], opset 17."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    weight = numpy_helper.from_array(np.linspace(-0.5, 0.5, 4 * 3 * 3 * 3, dtype=np.float32).reshape(4, 3, 3, 3), "w")
    bias = numpy_helper.from_array(np.array([0.1, -0.1, 0.2, 0.0], np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv_1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu_1")]
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [weight, bias])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def onnx_mutation(kind: str, data) -> tuple[bytes, str]:
    """The conv_relu model with one kind of damage (Hypothesis picks where and how much), and a word the error must
    name: the tensor, node or field concerned."""
    from onnx import TensorProto
    model = conv_relu()
    graph = model.graph
    named = ""
    if kind == "truncated":
        raw = model.SerializeToString()
        return raw[:data.draw(st.integers(0, len(raw) - 1), label="cut at")], "not a valid ONNX model"
    if kind == "opset":
        model.opset_import[0].version = data.draw(st.sampled_from([1, 6, 9, 12, 24, 99, 10**6]), label="opset")
        named = "opset"
    elif kind == "no opset":
        del model.opset_import[:]
        named = "opset"
    elif kind == "dynamic dim":
        tensor = data.draw(st.sampled_from([graph.input[0], graph.output[0]]), label="tensor")
        dim = tensor.type.tensor_type.shape.dim[data.draw(st.integers(0, 3), label="dim")]
        how = data.draw(st.sampled_from(["N", "", -1, 0]), label="as")
        if isinstance(how, str):
            dim.dim_param = how
        else:
            dim.dim_value = how
        named = f"'{tensor.name}'"
    elif kind in ("int64 input", "int64 output"):
        tensor = graph.input[0] if kind == "int64 input" else graph.output[0]
        tensor.type.tensor_type.elem_type = TensorProto.INT64
        named = f"'{tensor.name}' is int64"
    elif kind == "no initializer":
        index = data.draw(st.integers(0, len(graph.initializer) - 1), label="initializer")
        named = f"'{graph.initializer[index].name}'"
        del graph.initializer[index]
    elif kind == "unknown op":
        node = graph.node[data.draw(st.integers(0, len(graph.node) - 1), label="node")]
        node.op_type = "NoSuchOp"
        named = f"Name: {node.name} OpType: NoSuchOp"
    elif kind == "dangling input":
        graph.node[data.draw(st.integers(0, len(graph.node) - 1), label="node")].input[0] = "nothing_makes_this"
        named = "'nothing_makes_this'"
    elif kind == "empty graph":
        del graph.node[:]
        named = "'y'"
    elif kind == "unproduced output":
        graph.output[0].name = data.draw(st.sampled_from(["z", "", "x", "w"]), label="output name")
        named = "'name'" if graph.output[0].name == "" else f"'{graph.output[0].name}'"
    elif kind == "undefined dtype":
        tensor = data.draw(st.sampled_from([graph.input[0], graph.output[0]]), label="tensor")
        tensor.type.tensor_type.elem_type = data.draw(st.sampled_from(
            [TensorProto.UNDEFINED, TensorProto.STRING, TensorProto.BFLOAT16, TensorProto.COMPLEX64, 40]),
            label="elem_type")
        named = f"'{tensor.name}' is "
    return model.SerializeToString(), named


ONNX_CASES_PER_KIND = 6


@pytest.mark.parametrize("kind", ONNX_KINDS)
@settings(FUZZ, max_examples=ONNX_CASES_PER_KIND)
@given(data=st.data())
def test_onnx_mutations_in_the_simplify_stage(tmp_path_factory, kind, data):
    """ONNX mutants through the stage that reads the file first, in this process (the message is the point; a stage
    process start-up per case would cost ~2 s): a one-line BuildError naming the file and the tensor / node / field,
    and no output, or (an old opset, a dynamic dim of the output) a model QNN HTP runs."""
    from build_rules.errors import BuildError
    from build_rules.stages import simplify
    folder = tmp_path_factory.mktemp("simplify")
    raw, named = onnx_mutation(kind, data)
    source = folder / "model.onnx"
    source.write_bytes(raw)
    params = {"onnx": str(source), "inputs": {}, "output_names": ["y"], "where": "models/net/model.toml [graphs.net]",
              "outputs": {"onnx": str(folder / "net.sim.onnx"), "io": str(folder / "net.io.json"),
                          "ops": str(folder / "net.ops.json")}}
    try:
        simplify.run(params)
    except BuildError as e:
        message = str(e)
        assert "\n" not in message and message.startswith(f"{source}: "), (kind, message)
        assert named in message, (kind, named, message)
        assert sorted(p.name for p in folder.iterdir()) == ["model.onnx"], kind  # nothing half-written
    else:  # still a model QNN HTP can run (an old opset converted; an output dim inferred from the input's)
        assert kind in ("opset", "dynamic dim"), kind
        assert json.loads((folder / "net.io.json").read_text())["inputs"][0]["shape"] == [1, 3, 8, 8]


# --- end to end: real `doit` processes, a few (each costs a Python start-up and the build file's load) ---------------

def console(repo: Path, *args: str) -> subprocess.CompletedProcess:
    """`doit ARGS` as a user runs it, in its own process, with this checkout's build_rules."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, "-m", "doit", *args], cwd=repo, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


# One refused mutant of each kind the in-process cases found most (a byte that is not UTF-8, a number out of range,
# a value of the wrong type in chips.toml), and the line each must end with.
CONSOLE_CASES = [
    ("models/tinynet/model.toml", (b"dtype", b"dtype\xff"), ("list",),
     "error: models/tinynet/model.toml: not UTF-8: byte 0xff at offset "),
    ("models/tinynet/model.toml", (b"calibration_samples = 8\ngate = { metric = \"cosine\", min = 0.99 }",
                                   b"calibration_samples = 9223372036854775808\ngate = { metric = \"cosine\", min = 0.99 }"),
     (), "error: models/tinynet/model.toml: [graphs.encoder] calibration_samples: must be between 1 and 10000, "
         "got 9223372036854775808"),
    ("chips.toml", (b"soc_id = 43", b"soc_id = \"43\""), (),
     "error: chips.toml: [chips.SM8550] soc_id: expected an integer, got '43'"),
]


def test_console_config_errors_are_one_line_and_leave_out_alone(tinynet_repo):
    """4 `doit` processes: three refused configs (`doit list` or `doit`), each one line on the console, exit code 3,
    nothing written inside or outside out/; then, every file put back, a no-op `doit`."""
    for file, (old, new), args, line in CONSOLE_CASES:
        target = tinynet_repo / file
        original = target.read_bytes()
        assert old in original, (file, old)
        outside, inside = tree(tinynet_repo, skip_out=True), tree(tinynet_repo / "out", skip_out=False)
        target.write_bytes(original.replace(old, new, 1))
        try:
            result = console(tinynet_repo, *args)
            assert result.returncode == 3, result.stdout[-3000:]
            assert result.stdout.count("\n") == 1 and result.stdout.startswith(line), result.stdout[-3000:]
            assert tree(tinynet_repo / "out", skip_out=False) == inside, file
            after = tree(tinynet_repo, skip_out=True)
            assert {k: v for k, v in after.items() if k != file} == {k: v for k, v in outside.items() if k != file}
        finally:
            target.write_bytes(original)
    again = console(tinynet_repo)
    assert again.returncode == 0 and re.search(r"summary: 0 task\(s\) ran, \d+ up to date", again.stdout), \
        again.stdout[-3000:]


def test_console_onnx_errors_name_the_file_and_tensor_and_a_fixed_file_builds(tmp_path):
    """3 `doit` processes on an ONNX-only model: a truncated file and an int64 output each fail in simplify with one
    line naming the file (and the tensor), no traceback, no simplify output, an empty staging folder, nothing outside
    out/; the good file put back, `doit simplify` builds."""
    import onnx
    source = tmp_path / "src" / "net"
    source.mkdir(parents=True)
    onnx.save(conv_relu(), source / "model.onnx")
    (source / "hooks.py").write_text(ONNX_HOOKS)
    (source / "model.toml").write_text(ONNX_MODEL_TOML)
    repo = make_repo(tmp_path / "repo", {"net": source})
    onnx_file = repo / "models/net/model.onnx"
    good = onnx_file.read_bytes()
    outside = tree(repo, skip_out=True)
    from onnx import TensorProto
    int64_output = conv_relu()
    int64_output.graph.output[0].type.tensor_type.elem_type = TensorProto.INT64
    for raw, named, says in ((good[:len(good) // 2], "models/net/model.onnx: not a valid ONNX model: ", "ModelProto"),
                             (int64_output.SerializeToString(), "models/net/model.onnx: ", "output 'y' is int64")):
        onnx_file.write_bytes(raw)
        result = console(repo)
        assert result.returncode != 0 and "Traceback" not in result.stdout, result.stdout[-3000:]
        lines = [line for line in result.stdout.splitlines() if line.startswith(named)]
        assert len(lines) == 1 and says in lines[0], result.stdout[-3000:]
        assert not (repo / "out/net/float/net.sim.onnx").exists() and not (repo / "out/net/float/net.io.json").exists()
        staging = repo / "out/.staging"
        assert not staging.exists() or not any(staging.iterdir())
        after = tree(repo, skip_out=True)
        assert after.pop("models/net/model.onnx") != outside["models/net/model.onnx"]
        assert after == {k: v for k, v in outside.items() if k != "models/net/model.onnx"}
    onnx_file.write_bytes(good)
    fixed = console(repo, "simplify")
    assert fixed.returncode == 0, fixed.stdout[-3000:]
    assert json.loads((repo / "out/net/float/net.io.json").read_text())["outputs"][0]["dtype"] == "float32"

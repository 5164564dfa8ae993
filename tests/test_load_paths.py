"""The pieces a no-op `doit` runs on every load, made cheaper in issue 23: they must behave as before."""
from __future__ import annotations

import json

import pytest

from build_rules.plumbing.records import FrozenInstanceError, factory, record


@record
class Point:
    x: int
    y: int
    label: str = "p"
    tags: list = factory(list)


def test_records_fill_fields_in_order_with_defaults_and_factories():
    a = Point(1, y=2)
    assert repr(a) == "Point(x=1, y=2, label='p', tags=[])"
    assert list(a.__dict__) == ["x", "y", "label", "tags"]  # field order, whatever order the arguments came in
    b = Point(y=2, x=1)
    assert a == b
    assert a.tags is not b.tags  # a new list per instance
    assert Point(1, 2, "q", [3]).tags == [3]
    with pytest.raises(FrozenInstanceError):
        a.x = 3


@pytest.mark.parametrize("args, kwargs, message", [
    ((1,), {}, "missing argument 'y'"),
    ((), {"y": 2}, "missing argument 'x'"),
    ((1, 2), {"z": 3}, "unexpected or repeated argument 'z'"),
    ((1, 2), {"x": 3}, "unexpected or repeated argument 'x'"),
    ((1, 2, "q", [], 5), {}, "takes 4 arguments, 5 given"),
])
def test_records_report_wrong_arguments(args, kwargs, message):
    with pytest.raises(TypeError, match=message):
        Point(*args, **kwargs)


def test_stat_cache_reads_its_file_when_first_asked(tmp_path):
    from build_rules.build_state.hashing import StatCache, file_digest
    data = tmp_path / "data.bin"
    data.write_bytes(b"abc")
    st = data.stat()
    path = tmp_path / "stat-cache.json"
    cache = StatCache(str(path))  # no file yet: read on first use, not when made
    path.write_text(json.dumps({str(data): [st.st_size, st.st_mtime_ns, st.st_ino, "remembered"]}))
    assert cache.digest(str(data), st) == "remembered"  # the entry of the current stat: the file is not read
    assert cache.bytes_hashed == 0
    (tmp_path / "damaged.json").write_text("{")
    assert StatCache(str(tmp_path / "damaged.json")).digest(str(data), st) == file_digest(data)


def test_written_paths_reads_stage_actions_as_given_and_as_doit_makes_them():
    from doit.task import Task

    from build_rules.doit_run import target_set
    from build_rules.runner import run_stage

    def task(name, actions):
        return Task(name, actions, targets=[f"out/m/{name.split(':')[1]}.check.json"])

    tasks = {t.name: t for t in [
        task("check:a", [(run_stage, ["check", {}, [], "out/m/a.log"], {"publish_dirs": ("out/m/d",)})]),
        task("check:b", [(run_stage, ["check", {}, [], "out/m/b.log"])]),
        task("check:c", [(json.dumps, ["not a stage"])]),
        task("mine:d", [(run_stage, ["check", {}, [], "out/m/d.log"])]),  # not a build_rules stage: not counted
        Task("compile:e", None, targets=["out/m/e.bin"]),  # a group: no actions
    ]}
    expected = ["out/m/a.check.json", "out/m/a.measure.json", "out/m/a.proof.npz", "out/m/a.proof.json", "out/m/a.log",
                "out/m/d/", "out/m/b.check.json", "out/m/b.measure.json", "out/m/b.proof.npz", "out/m/b.proof.json",
                "out/m/b.log", "out/m/c.check.json", "out/m/c.measure.json", "out/m/c.proof.npz", "out/m/c.proof.json"]
    assert target_set.written_paths(tasks) == expected
    for t in tasks.values():
        t.actions  # doit's action objects, made: the same paths
    assert target_set.written_paths(tasks) == expected

"""Device tasks (issue 29) against stand-in phones: a fake adb (each phone a folder) and a stand-in aarch64
qnn-net-run that runs the pushed binary on the x86 HTP emulator (tests/fake_phone/). Nothing here ran on a phone."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from build_rules.device.cpu_runtime import NOT_SET
from conftest import ROOT, run_doit
from fake_phone.make_phone import make_adb, make_cpu_runtime, make_phone, make_runtime, set_phone

SERIAL = "R5CX1234ABC"
DEVICES_TOML = f'[devices.s25]\nserial = "{SERIAL}"\nsoc = "SM8750"\nmodel = "SM-S931B"\n'
CHECK = "device_check:tinynet/encoder/w8a16@s25"
RESULT = "out/tinynet/w8a16/SM8750/encoder.device.s25.json"
RUNTIME = "2.51.0.260929"  # the phone's QAIRT runtime: the binaries' QNN 2.51 (onnxruntime-qnn 2.7) or newer


@pytest.fixture
def phone_env(tinynet_repo, tmp_path, monkeypatch):
    """The built tiny repo with devices.toml, one stand-in S25 (SM8750) plugged in and a stand-in QAIRT runtime as new
    as the binaries' QNN (onnxruntime-qnn 2.7: QNN 2.51)."""
    runtime = make_runtime(tmp_path / "qairt" / RUNTIME, RUNTIME)
    monkeypatch.setenv("BUILD_RULES_QNN_RUNTIME", str(runtime))
    monkeypatch.delenv("QNN_SDK_ROOT", raising=False)
    return plug_phone(tinynet_repo, tmp_path, monkeypatch)


def plug_phone(repo: Path, tmp_path: Path, monkeypatch):
    """devices.toml in the repo, the fake adb first on PATH, one stand-in S25 (SM8750) plugged in."""
    bin_dir = tmp_path / "adb-bin"
    make_adb(bin_dir)
    phones = tmp_path / "phones"
    phone = make_phone(phones, SERIAL, host_repo=repo)
    log = tmp_path / "adb.log"
    log.write_text("")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_ADB_PHONES", str(phones))
    monkeypatch.setenv("FAKE_ADB_LOG", str(log))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.delenv("BUILD_RULES_CPU_RUNTIME", raising=False)
    (repo / "devices.toml").write_text(DEVICES_TOML)

    class Env:
        folder, phones_dir = phone, phones

        @staticmethod
        def calls() -> list[list[str]]:
            return [json.loads(line)["argv"] for line in log.read_text().splitlines()]

        @staticmethod
        def clear() -> None:
            log.write_text("")
    Env.repo = repo
    return Env


def _pushes(calls):
    return [c for c in calls if "push" in c]


def _pushed(calls) -> list[str]:
    """The local files of every `adb -s S push [--sync] LOCAL... REMOTE`."""
    return [a for c in _pushes(calls) for a in c[c.index("push") + 1:-1] if not a.startswith("-")]


def _net_runs(calls):
    return [" ".join(c) for c in calls if "shell" in c and "--retrieve_context" in " ".join(c)]


@pytest.mark.slow
def test_device_check_passes_with_the_emulators_numbers_and_pushes_nothing_twice(phone_env):
    repo = phone_env.repo
    result = run_doit(repo, CHECK)
    assert result.code == 0, result.output
    record = json.loads((repo / RESULT).read_text())
    check = json.loads((repo / "out/tinynet/w8a16/SM8750/encoder.check.json").read_text())
    emulator = check["summary"]
    # the same binary through the stand-in qnn-net-run on the HTP emulator: the emulator's numerics, within the
    # float32 raw-file round trip (qnn-net-run's float outputs vs the EPContext model's DequantizeLinear)
    assert record["summary"]["cosine"] == pytest.approx(emulator["cosine"], abs=1e-5)
    assert 0.99 <= record["summary"]["cosine"] < 1.0
    assert record["passed"] is True and record["gated"][0]["gate"] == "cosine >= 0.99"
    assert record["phone_model"] == "SM-S931B" and record["chip"] == "SM8750" and record["samples"] == check["samples"]
    assert record["fingerprint"].startswith("samsung/pa1qxxx/pa1q:15/")
    assert record["runtime"] == {"version": "2.51.0", "build_id": "260929"}
    assert record["quantization"]["activations"] == "uint16"
    assert record["metrics"]["repeats"]["repeats"] is True and record["metrics"]["repeats"]["samples"] == check["samples"]
    # the summary: the phone's own line, not the model's emulator results as "earlier" lines
    assert (f"\n  phone       {CHECK}: pass (cosine >= 0.99), cosine {record['summary']['cosine']:.6g} sqnr "
            f"{record['summary']['sqnr']:.6g} on SM-S931B over {record['samples']} sample(s), each run twice with the same "
            "bytes\n") in result.output
    assert "earlier" not in result.output and "up to date  out/tinynet" not in result.output
    pushed = {Path(local).name for local in _pushed(phone_env.calls())}
    assert {"libQnnHtp.so", "libQnnHtpV79Stub.so", "libQnnSystem.so", "libQnnHtpV79Skel.so", "qnn-net-run",
            "encoder.bin", "input_list.txt", "0000.image.raw"} <= pushed
    assert not any("V73" in name or "Prepare" in name for name in pushed)  # only the phone's arch; no prepare lib
    # one `adb push LOCAL... FOLDER` per remote folder (207 single-file pushes for one device check before issue 37)
    assert sorted(c[-1] for c in _pushes(phone_env.calls())) == [
        "/data/local/tmp/build_rules/bin/tinynet/w8a16/SM8750/encoder.bin",
        "/data/local/tmp/build_rules/inputs/tinynet/encoder/", "/data/local/tmp/build_rules/runtime/"]
    phone_env.clear()
    again = run_doit(repo, CHECK)
    assert again.code == 0, again.output
    assert _pushes(phone_env.calls()) == []  # everything already there, by sha256
    assert _net_runs(phone_env.calls()) == []  # same binary, runtime, phone build: the saved numbers, judged again
    assert json.loads((repo / RESULT).read_text())["summary"] == record["summary"]
    set_phone(phone_env.folder, **{"ro.build.fingerprint": "samsung/pa1qxxx/pa1q:16/BP2A.250605.031/S931BXXU3BYF1:user/"
                                                           "release-keys"})  # an OTA update: measured again
    phone_env.clear()
    assert run_doit(repo, CHECK).code == 0
    # twice: does the phone repeat itself (the stand-in runs the emulator, which does for this binary)
    assert len(_net_runs(phone_env.calls())) == 2 and _pushes(phone_env.calls()) == []
    assert json.loads((repo / RESULT).read_text())["fingerprint"].startswith("samsung/pa1qxxx/pa1q:16/")


def test_device_check_fails_its_gate_with_the_numbers_kept(phone_env):
    repo = phone_env.repo
    toml = repo / "models/tinynet/model.toml"
    toml.write_text(toml.read_text().replace('gate = { metric = "cosine", min = 0.99 }',
                                             'gate = { metric = "cosine", min = 0.9999999 }'))
    result = run_doit(repo, CHECK)
    assert result.code != 0
    record = json.loads((repo / RESULT).read_text())
    assert record["passed"] is False and record["gated"][0]["passed"] is False
    short = 0.9999999 - record["summary"]["cosine"]
    assert f"{CHECK}: gate failed: cosine = " in result.output and f"(short by {short:.4g})" in result.output


def test_a_phone_of_another_soc_is_refused_naming_both(phone_env):
    set_phone(phone_env.folder, **{"ro.soc.model": "SM8650"})
    result = run_doit(phone_env.repo, CHECK)
    assert result.code != 0
    assert ("phone s25 (R5CX1234ABC) reports ro.soc.model 'SM8650', but devices.toml names SM8750 and the binary is "
            "compiled for SM8750 (v79)") in result.output
    assert _pushes(phone_env.calls()) == [] and not (phone_env.repo / RESULT).exists()


def test_a_soc_with_no_chip_is_refused_naming_both(phone_env):
    set_phone(phone_env.folder, **{"ro.soc.model": "SM7675"})  # Snapdragon 7+ Gen 3: not in chips.toml
    result = run_doit(phone_env.repo, CHECK)
    assert result.code != 0
    assert "reports ro.soc.model 'SM7675', which maps to no chip in chips.toml (chips: SM8550, SM8650" in result.output
    assert _pushes(phone_env.calls()) == []
    (phone_env.repo / "devices.toml").write_text(DEVICES_TOML.replace('soc = "SM8750"', 'soc = "SM7675"'))
    listed = run_doit(phone_env.repo, "list")
    assert listed.code == 0, listed.output  # a mistake in one phone's table leaves that phone's tasks out, no more
    assert ("warning: devices.toml [devices.s25]: soc = 'SM7675' (the phone's ro.soc.model) maps to no chip in "
            "chips.toml") in listed.output
    assert "@s25" not in listed.output


def test_a_devices_toml_mistake_is_one_line_and_fails_no_build_that_touches_no_phone(tinynet_repo):
    """A missing serial (issue 37): it was a traceback that blocked `doit list` and every build."""
    (tinynet_repo / "devices.toml").write_text('[devices.s25]\nsoc = "SM8750"\n\n' + DEVICES_TOML.replace(
        "[devices.s25]", "[devices.pixel]"))
    line = ("devices.toml [devices.s25]: no serial (a string: the first column of `adb devices -l`); `python -m "
            "build_rules.device list` prints the table to paste")
    listed = run_doit(tinynet_repo, "list", "--all")
    assert listed.code == 0, listed.output
    assert f"warning: {line} (its device tasks are left out)" in listed.output.splitlines()
    assert "device_check:tinynet/encoder/w8a16@pixel" in listed.output and "@s25" not in listed.output
    assert "Traceback" not in listed.output
    build = run_doit(tinynet_repo, "-a", "size:tinynet/encoder/w8a16")  # no phone: builds as before
    assert build.code == 0, build.output
    assert "size:tinynet/encoder/w8a16" in build.ran
    asked = run_doit(tinynet_repo, CHECK)
    assert asked.code == 3
    assert f"ERROR: {CHECK}: {line}\n" in asked.output and "Invalid parameter" not in asked.output


def test_a_device_task_of_a_phone_no_devices_toml_names_says_how_to_name_it(tinynet_repo):
    asked = run_doit(tinynet_repo, "profile:tinynet/w8a16@s25")  # no devices.toml at all
    assert asked.code == 3
    assert ("ERROR: profile:tinynet/w8a16@s25: no devices.toml names s25 (there is no devices.toml beside "
            "chips.toml): add a table to devices.toml beside chips.toml:\n[devices.s25]\nserial = \"<adb devices -l, "
            "first column>\"\nsoc = \"<its ro.soc.model, a chip of chips.toml>\"\n(`python -m build_rules.device "
            "list` prints one for every phone plugged in; docs/device.md)") in asked.output
    (tinynet_repo / "devices.toml").write_text(DEVICES_TOML.replace("[devices.s25]", "[devices.pixel]"))
    asked = run_doit(tinynet_repo, "power:tinynet/w8a16@s25")
    assert asked.code == 3
    assert "ERROR: power:tinynet/w8a16@s25: devices.toml names no phone s25 (it names pixel): add a table" \
        in asked.output
    wrong = run_doit(tinynet_repo, "power:tinynet/w9a9@pixel")  # the phone is named: doit's own message stands
    assert wrong.code == 3 and 'Invalid parameter: "power:tinynet/w9a9@pixel"' in wrong.output
    assert run_doit(tinynet_repo, "list").code == 0


def test_without_an_sdk_the_task_fails_before_touching_the_phone(phone_env, monkeypatch):
    monkeypatch.delenv("BUILD_RULES_QNN_RUNTIME")
    result = run_doit(phone_env.repo, CHECK)
    assert result.code != 0
    assert f"{CHECK}: no QNN runtime for the phone: set QNN_SDK_ROOT to an unpacked QAIRT SDK" in result.output
    assert "BUILD_RULES_QNN_RUNTIME" in result.output and "onnxruntime-qnn's wheel has no Android libraries" \
        in result.output
    assert phone_env.calls() == []  # adb never ran


def test_a_runtime_older_than_the_binaries_is_refused_before_any_push(phone_env, tmp_path, monkeypatch):
    """A 2.40 runtime ran 2.51-built binaries (issue 37); a phone refuses a context binary from a newer SDK."""
    old = make_runtime(tmp_path / "qairt" / "2.40.0.251030")
    monkeypatch.setenv("BUILD_RULES_QNN_RUNTIME", str(old))
    result = run_doit(phone_env.repo, CHECK)
    assert result.code != 0
    assert (f"{CHECK}: the QNN runtime for the phone is QAIRT 2.40.0 (BUILD_RULES_QNN_RUNTIME={old}, sdk.yaml), older "
            "than the binaries' QNN 2.51.0 (onnxruntime-qnn 2.7.0 (QNN 2.51.0, build v2.51.0.") in result.output
    assert ("a phone refuses a context binary from a newer SDK (\"Using newer context binary on old SDK\"). Use a "
            "QAIRT SDK 2.51.0 or newer for the phone (BUILD_RULES_QNN_RUNTIME), or build the binaries with the phone's "
            "SDK (toolchain = \"qairt\" in chips.toml, QNN_SDK_ROOT at that SDK)") in result.output
    assert phone_env.calls() == []  # refused before adb ran
    (old / "sdk.yaml").unlink()
    nameless = tmp_path / "runtime-copy"
    old.rename(nameless)
    monkeypatch.setenv("BUILD_RULES_QNN_RUNTIME", str(nameless))
    result = run_doit(phone_env.repo, CHECK)
    assert f"{CHECK}: cannot tell the version of the QNN runtime at {nameless} (BUILD_RULES_QNN_RUNTIME)" \
        in result.output and phone_env.calls() == []


def test_the_stand_in_phone_refuses_a_binary_from_a_newer_sdk_as_a_real_one_does(phone_env, tmp_path):
    """Past the host's check (a runtime pushed by hand): the stand-in qnn-net-run reads its backend library's version
    and the QNN build id in the binary, and refuses as a 2.32 runtime refused a 2.50 binary."""
    from build_rules.device.adb import Adb
    from build_rules.device.push import push_missing
    from build_rules.device.runtime import files
    from build_rules.device.session import REMOTE_RUNTIME, net_run
    old = make_runtime(tmp_path / "qairt" / "2.40.0.251030")
    phone = Adb(SERIAL, "s25")
    binary = "/data/local/tmp/build_rules/bin/encoder.bin"
    push_missing(phone, {**{f"{REMOTE_RUNTIME}/{name}": path for name, path in files(old, "v79", "test").items()},
                         binary: phone_env.repo / "out/tinynet/w8a16/SM8750/encoder.bin"})
    code, output = phone.shell_code(net_run(binary, "/data/local/tmp/build_rules/list.txt", "/data/local/tmp/out"))
    assert code == 1
    assert output.strip().splitlines() == ["<E> Using newer context binary on old SDK",
                                           "<E> Fail to get context blob with err 5000",
                                           "<E> Failed to create context from binary with err 0x1388"]


def test_a_phone_unplugged_mid_run_gives_a_clear_error_and_no_result(phone_env):
    set_phone(phone_env.folder, unplug_when="qnn-net-run --backend")
    result = run_doit(phone_env.repo, CHECK)
    assert result.code != 0
    assert "adb exit 1" in result.output and "adb: device 'R5CX1234ABC' not found" in result.output
    assert "the phone s25 (R5CX1234ABC) is not connected any more: plug it in" in result.output
    assert not (phone_env.repo / RESULT).exists()


def test_a_phone_that_stops_answering_times_out_naming_the_command_and_the_phone(phone_env, monkeypatch):
    monkeypatch.setenv("BUILD_RULES_PHONE_RUN_TIMEOUT", "3")
    set_phone(phone_env.folder, hang_when="qnn-net-run --backend")
    result = run_doit(phone_env.repo, CHECK)
    assert result.code != 0
    assert re.search(r"device_check:tinynet/encoder/w8a16@s25: `adb -s R5CX1234ABC shell rm -rf \S+ && cd "
                     r"/data/local/tmp/build_rules && .* \.\.\.` did not finish in 3 s on the phone s25 \(R5CX1234ABC\): "
                     r"is the phone awake, unlocked and still plugged in \(`adb devices -l`\)\? A model run that needs "
                     r"longer: BUILD_RULES_PHONE_RUN_TIMEOUT=<seconds>", result.output), result.output
    assert not (phone_env.repo / RESULT).exists()


def test_a_phone_run_timeout_that_is_not_seconds_is_named(monkeypatch):
    """A negative timeout was taken as is (every model run then timed out at once, naming a timeout of -5 s)."""
    from build_rules.device import adb
    for value in ("-5", "0", "1h"):
        monkeypatch.setenv("BUILD_RULES_PHONE_RUN_TIMEOUT", value)
        said = rf"^BUILD_RULES_PHONE_RUN_TIMEOUT='{value}' is not a number of seconds > 0 \(e\.g\. 3600\); unset it "
        with pytest.raises(adb.DeviceError, match=said + r"for the default 1800$"):
            adb.run_seconds()
    monkeypatch.setenv("BUILD_RULES_PHONE_RUN_TIMEOUT", "3600")
    assert adb.run_seconds() == 3600.0


def test_the_stand_in_adb_pushes_as_the_real_one_does(phone_env, tmp_path):
    """`adb push [--sync] [-z ALGORITHM] [-Z] LOCAL... REMOTE`: several files into a folder, a folder whole, --sync
    skipping what the phone has with the same size and mtime; the syntax as strict as adb's."""
    def adb(*args):
        done = subprocess.run(["adb", "-s", SERIAL, *args], capture_output=True, text=True, env=os.environ)
        return done.returncode, done.stdout + done.stderr
    fs = phone_env.folder / "fs"
    folder = tmp_path / "up"
    (folder / "sub").mkdir(parents=True)
    for name in ("a.raw", "b.raw", "sub/c.raw"):
        (folder / name).write_text(name)
    assert adb("push", str(folder / "a.raw"), str(folder / "b.raw"), "/data/local/tmp/none") == (
        1, "adb: error: target '/data/local/tmp/none' is not a directory\n")
    assert adb("push", "--bogus", str(folder / "a.raw"), "/data/local/tmp/")[0] == 1
    assert adb("push", str(folder / "a.raw"))[0] == 1
    code, out = adb("push", str(folder / "a.raw"), str(folder / "b.raw"), "/data/local/tmp/")
    assert code == 0 and out.endswith("2 files pushed, 0 skipped. " + out.rsplit("skipped. ", 1)[1])
    assert (fs / "data/local/tmp/b.raw").read_text() == "b.raw"
    assert adb("push", str(folder), "/data/local/tmp/")[0] == 0  # a folder into a folder: REMOTE/<name>/...
    assert (fs / "data/local/tmp/up/sub/c.raw").read_text() == "sub/c.raw"
    code, out = adb("push", "--sync", str(folder), "/data/local/tmp/")
    assert code == 0 and "0 files pushed, 3 skipped." in out  # same size and mtime: skipped
    (folder / "a.raw").write_text("A.RAW")
    os.utime(folder / "a.raw", (1e9, 1e9))
    code, out = adb("push", "--sync", str(folder), "/data/local/tmp/")
    assert "1 file pushed, 2 skipped." in out and (fs / "data/local/tmp/up/a.raw").read_text() == "A.RAW"


def test_clean_removes_the_tools_files_from_the_phone(phone_env):
    repo = phone_env.repo
    assert run_doit(repo, CHECK).code == 0
    tool = phone_env.folder / "fs/data/local/tmp/build_rules"
    assert (tool / "runtime/libQnnHtp.so").is_file()
    (phone_env.folder / "fs/data/local/tmp/someone-elses.txt").write_text("kept")
    done = subprocess.run([sys.executable, "-m", "build_rules.device", "clean", "s25"], cwd=repo, capture_output=True,
                          text=True, env=os.environ)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ("s25 (R5CX1234ABC): removed /data/local/tmp/build_rules/ (what the device tasks pushed and "
                           "ran there)\n")
    assert not tool.exists() and (phone_env.folder / "fs/data/local/tmp/someone-elses.txt").is_file()
    assert (repo / RESULT).is_file()  # the results on this machine stay
    done = subprocess.run([sys.executable, "-m", "build_rules.device", "clean", "pixel"], cwd=repo,
                          capture_output=True, text=True, env=os.environ)
    assert done.returncode == 1
    assert done.stderr == ("error: pixel: neither a phone devices.toml names nor a serial `adb devices -l` "
                           "lists\n")
    phone_env.clear()
    assert run_doit(repo, CHECK).code == 0  # the same key: judged again, the runtime pushed anew
    assert {"libQnnHtp.so", "qnn-net-run"} <= {Path(p).name for p in _pushed(phone_env.calls())}


def test_a_library_missing_on_the_phone_gets_a_hint_and_keeps_the_last_good_result(phone_env, monkeypatch):
    from build_rules.device import on_phone
    repo = phone_env.repo
    assert run_doit(repo, CHECK).code == 0
    good = json.loads((repo / RESULT).read_text())
    set_phone(phone_env.folder, **{"ro.build.fingerprint": "samsung/pa1qxxx/pa1q:16/BP2A.250605.031/S931BXXU3BYF1:user/"
                                                           "release-keys"})  # an OTA: the phone runs again
    original = on_phone.push_runtime_and

    def push_then_lose_the_stub(phone, more):
        pushed = original(phone, more)
        (phone_env.folder / "fs/data/local/tmp/build_rules/runtime/libQnnHtpV79Stub.so").unlink()
        return pushed
    monkeypatch.setattr(on_phone, "push_runtime_and", push_then_lose_the_stub)
    result = run_doit(repo, CHECK)
    assert result.code != 0
    assert ('[ ERROR ] Unable to load backend. dlerror(): dlopen failed: library "libQnnHtpV79Stub.so" not found '
            "(LD_LIBRARY_PATH)\nhint: libQnnHtpV79Stub.so is part of the QNN runtime this task pushes to "
            "/data/local/tmp/build_rules/runtime/ (from ") in result.output
    assert ("and qnn-net-run did not find it there on the phone: remove the tool's files with `python -m "
            "build_rules.device clean s25` and run the task again, which pushes the whole runtime anew") in result.output
    kept = json.loads((repo / RESULT).read_text())  # the earlier good numbers stay, marked stale
    assert kept["summary"] == good["summary"] and kept["fingerprint"] == good["fingerprint"]
    assert kept["stale"]["why"] == ('the last run failed: [ ERROR ] Unable to load backend. dlerror(): dlopen failed: '
                                    'library "libQnnHtpV79Stub.so" not found (LD_LIBRARY_PATH)')
    assert run_doit(repo, "report").code == 0
    row = next(line for line in (repo / "out/tinynet/report.md").read_text().split("## On phones", 1)[1].splitlines()
               if line.startswith("| w8a16 | SM8750 | encoder | "))
    assert f"pass (cosine >= 0.99) (stale since {kept['stale']['since']}: the last run failed)" in row


def test_doit_list_never_calls_adb_and_lists_the_device_tasks(phone_env):
    result = run_doit(phone_env.repo, "list", "--all")
    assert result.code == 0, result.output
    assert CHECK in result.output and "profile:tinynet/w8a16@s25" in result.output
    assert "device_check:tinynet/encoder/w8a16@s25" in result.output
    assert not any("SM8550" in line for line in result.output.splitlines() if "@s25" in line)
    assert phone_env.calls() == []


def test_list_command_prints_the_table_to_paste(phone_env):
    make_phone(phone_env.phones_dir, "ZY22ABCDEF", soc="SM7675", arch="v73", host_repo=phone_env.repo,
               product="moto edge 30 pro")
    done = subprocess.run([sys.executable, "-m", "build_rules.device", "list"], cwd=phone_env.repo,
                          capture_output=True, text=True, env=os.environ)
    assert done.returncode == 0, done.stderr
    assert f'[devices.sm-s931b]\nserial = "{SERIAL}"\nsoc = "SM8750"\nmodel = "SM-S931B"\n' in done.stdout
    assert "# ro.build.fingerprint: samsung/pa1qxxx" in done.stdout
    assert ("ZY22ABCDEF (moto edge 30 pro): ro.soc.model 'SM7675' maps to no chip in chips.toml (chips: SM8550"
            in done.stderr)


@pytest.mark.slow
def test_report_shows_the_phone_beside_the_emulator_and_dist_lists_it(phone_env):
    repo = phone_env.repo
    assert run_doit(repo, CHECK).code == 0
    phone_env.clear()
    report = run_doit(repo, "report")
    assert report.code == 0, report.output
    assert phone_env.calls() == []  # the report reads the result; it never runs the phone task again
    text = (repo / "out/tinynet/report.md").read_text()
    table = text.split("## On phones", 1)[1]
    row = next(line for line in table.splitlines() if line.startswith("| w8a16 | SM8750 | encoder | "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    record = json.loads((repo / RESULT).read_text())
    assert cells[4:7] == ["s25", "SM-S931B", record["fingerprint"]]
    assert cells[7] == "2.51.0 260929" and cells[10] == "pass (cosine >= 0.99)"
    assert float(cells[8]) == pytest.approx(record["summary"]["cosine"], abs=1e-6)
    assert float(cells[3]) == pytest.approx(float(cells[8]), abs=1e-5)  # emulator beside phone
    dist = run_doit(repo, "dist:tinynet/w8a16")
    assert dist.code == 0, dist.output
    assert phone_env.calls() == []
    index = json.loads((repo / "out/tinynet/dist/w8a16/index.json").read_text())
    entry = index["chips"]["SM8750"]["device_checks"]["encoder"]["s25"]
    assert entry["passed"] is True and entry["fingerprint"] == record["fingerprint"]
    assert "device_checks" not in index["chips"]["SM8550"]


def test_profile_reads_back_latencies_beside_the_cpu_baseline(phone_env, monkeypatch, tmp_path):
    monkeypatch.setenv("BUILD_RULES_PROFILE_RUNS", "6")
    monkeypatch.setenv("BUILD_RULES_PROFILING_LEVEL", "detailed")
    monkeypatch.setenv("BUILD_RULES_CPU_RUNTIME", str(make_cpu_runtime(tmp_path / "cpu-runtime")))
    result = run_doit(phone_env.repo, "profile:tinynet/fp16@s25")
    assert result.code == 0, result.output
    record = json.loads((phone_env.repo / "out/tinynet/fp16/SM8750/profile.s25.json").read_text())
    assert record["perf_profile"] == "burst" and set(record["graphs"]) == {"encoder", "head"}
    for t in record["graphs"].values():
        assert t["runs"] == 6 and t["warmup"] == 3
        assert 0 < t["median_ms"] <= t["p90_ms"] and t["load_ms"] > 0 and t["first_ms"] > 0
        assert 0 < t["accelerator_median_ms"] <= t["median_ms"]  # QNN's own rows, from the emulator's profiling
        assert t["accelerator_cycles_median"] > 0 and t["top_ops"]  # detailed: per-op cycles
        # each share is the op's median over the runs against the median total (the emulator's counts move run to
        # run by several percent), so together they can pass 1 by a little, not by much
        assert all(0 <= op["share"] <= 1 for op in t["top_ops"]) and sum(op["share"] for op in t["top_ops"]) <= 1.05
        cpu = t["cpu"]  # the float graph through ort-cpu-run (the x86 build behind the stand-in loader)
        assert cpu["measured"] is True and cpu["runs"] == 6 and cpu["warmup"] == 3
        assert 0 < cpu["median_ms"] <= cpu["p90_ms"] and cpu["load_ms"] > 0
        assert cpu["runner"].startswith("ort-cpu-run, ONNX Runtime 1.") and "CPU execution provider" in cpu["runner"]
        assert cpu["thermal"]["after"]["status_name"] == "none"  # read around the CPU run too
        assert any(f.startswith("noisy: ") for f in cpu["flags"]) == (cpu["p90_ms"] / cpu["median_ms"] > 1.5)
    runs = _net_runs(phone_env.calls())
    profiled = [c for c in runs if "--num_inferences 9" in c]
    warm = [c for c in runs if "--num_inferences 1 --keep_num_outputs 1" in c]  # the warm-load run per binary
    assert len(runs) == 4 and len(profiled) == 2 and len(warm) == 2
    # the 2.40 runtime takes the HTP perf profile through the backend extension config (--perf_profile: deprecated)
    config = "--config_file /data/local/tmp/build_rules/config/netrun_burst.json"
    assert all(f"{config} --profiling_level detailed --num_inferences 9 --use_native_input_files "
               "--use_native_output_files --keep_num_outputs 1" in c for c in profiled)
    assert all("/system/bin/time -v /data/local/tmp/build_rules/runtime/qnn-net-run" in c for c in profiled)
    assert not any("--perf_profile" in c for c in runs) and "deprecated" not in result.output
    assert record["perf_profile_form"] == "backend extension config"
    pushed = {Path(local).name for local in _pushed(phone_env.calls())}  # (folder pushes: the local files' names)
    assert {"libQnnHtpNetRunExtensions.so", "htp_perf_burst.json", "netrun_burst.json"} <= pushed
    assert all((phone_env.folder / "fs/data/local/tmp/build_rules" / f).is_file() for f in (
        "runtime/libQnnHtpNetRunExtensions.so", "config/htp_perf_burst.json", "config/netrun_burst.json"))
    htp = json.loads((phone_env.folder / "fs/data/local/tmp/build_rules/config/htp_perf_burst.json").read_text())
    assert htp["devices"][0]["cores"][0]["perf_profile"] == "burst"
    # native inputs: the binary's uint16 fixed point for w8a16, its float32 for fp16 (the EPContext model's types)
    native = phone_env.folder / "fs/data/local/tmp/build_rules/inputs/tinynet/fp16/SM8750/encoder/native"
    assert (native / "0000.image.raw").stat().st_size == 1 * 3 * 16 * 16 * 4
    assert record["peak_memory"] == "max RSS of qnn-net-run (/system/bin/time -v)"
    for graph, t in record["graphs"].items():
        assert t["io"].startswith("native: the binary's own input/output types")
        assert t["min_ms"] <= t["median_ms"] <= t["p90_ms"] <= t["max_ms"]
        assert t["throughput_per_s"] == pytest.approx(1000 / t["median_ms"])
        assert t["warm_load_ms"] > 0 and t["peak_memory_kib"] > 10_000  # the stand-in's emulator process, measured
        assert [layer["op"] for layer in t["layers"][:10]] == [op["op"] for op in t["top_ops"]]
        # each layer's time is its share of the accelerator's median: its median cycles over the median of all cycles
        # (the ops' medians need not add up to the median of their sum: 0.89 of it in one fresh run; the bound on the
        # shares is above; a 10 % bound on that sum here failed once)
        cycles = sum(layer["cycles"] for layer in t["layers"])
        assert sum(layer["us"] for layer in t["layers"]) == pytest.approx(
            1000 * t["accelerator_median_ms"] * cycles / t["accelerator_cycles_median"])
        # the raw log beside the result, with the CSV the viewer made of it
        log = phone_env.repo / f"out/tinynet/fp16/SM8750/profile.s25/{graph}.qnn-profiling-data_0.log"
        assert log.is_file() and t["log"] == str(log.relative_to(phone_env.repo))
        assert (log.parent / f"{graph}.profile.csv").read_text().startswith("Msg Timestamp,Message,Time")
        assert t["thermal"]["before"]["status"] == 0 and t["thermal"]["after"]["cpu_max_c"] == 38.5
        noisy = t["p90_ms"] / t["median_ms"] > 1.5  # the emulator's times on a loaded host: either may happen
        assert any(f.startswith("noisy: ") for f in t["flags"]) == noisy
    shells = [" ".join(c) for c in phone_env.calls() if "shell" in c]
    cpu_runs = [c for c in shells if "/cpu/ld-linux-aarch64.so.1 --library-path /data/local/tmp/build_rules/cpu" in c]
    assert len(cpu_runs) == 2 and all("--num_inferences 9 --keep_num_outputs 1" in c for c in cpu_runs)
    assert "--model /data/local/tmp/build_rules/float/tinynet/encoder.onnx" in cpu_runs[0]
    assert "--input image=1x3x16x16:float32 --output features=1x64" in cpu_runs[0]
    assert run_doit(phone_env.repo, "report").code == 0
    table = (phone_env.repo / "out/tinynet/report.md").read_text().split("## Latency on phones", 1)[1]
    row = next(line for line in table.splitlines() if line.startswith("| fp16 | SM8750 | s25 | encoder | burst |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    encoder = record["graphs"]["encoder"]
    assert cells[5] == "native"
    for column, key in ((6, "load_ms"), (7, "warm_load_ms"), (8, "first_ms"), (9, "min_ms"), (10, "median_ms"),
                        (11, "p90_ms"), (12, "max_ms")):
        assert float(cells[column]) == pytest.approx(encoder[key], rel=1e-3), key
    assert float(cells[13]) == pytest.approx(encoder["peak_memory_kib"] / 1024, rel=1e-3)
    assert float(cells[14]) == pytest.approx(encoder["cpu"]["median_ms"], rel=1e-3)
    summary = next(line for line in result.output.splitlines() if line.startswith("  phone       profile:"))
    head = record["graphs"]["head"]
    assert summary.startswith(f"  phone       profile:tinynet/fp16@s25: encoder median {encoder['median_ms']:.3g} ms "
                              f"p90 {encoder['p90_ms']:.3g} ms (CPU {encoder['cpu']['median_ms']:.3g} ms)")
    assert f"head median {head['median_ms']:.3g} ms p90 {head['p90_ms']:.3g} ms (CPU " in summary
    assert summary.endswith("; burst, native I/O")
    # what the task runs, said up front, and its progress after each run
    assert ("   profile:tinynet/fp16@s25: 2 graph(s) x (3 warm-up + 6 runs) on the NPU, a warm-load run per binary, "
            "the CPU baseline per graph\n") in result.output
    assert "   profile:tinynet/fp16@s25: encoder done (1/4), " in result.output
    assert "   profile:tinynet/fp16@s25: head CPU baseline done (4/4), " in result.output
    ops = (phone_env.repo / "out/tinynet/report.md").read_text().split("Ops with the most accelerator cycles", 1)[1]
    top = record["graphs"]["head"]["top_ops"][0]
    assert f"| fp16 | SM8750 | s25 | head | {top['op']} | {top['cycles']:.0f} | {100 * top['share']:.1f} % |" in ops


def test_profile_reads_the_thermal_state_flags_a_throttled_run_and_cools_down(phone_env, monkeypatch):
    """w8a16: native inputs in the binary's uint16; a phone at thermal status moderate: every graph flagged, the
    summary says so; BUILD_RULES_PROFILE_COOLDOWN waits between the graphs."""
    import numpy as np

    from build_rules.device import profile
    from build_rules.bundles.dist_contract import contract_from_ctx, quantize
    from build_rules.measuring.samples import load_evaluation
    monkeypatch.setenv("BUILD_RULES_PROFILE_RUNS", "2")
    monkeypatch.setenv("BUILD_RULES_PROFILE_COOLDOWN", "45")
    waited = []
    monkeypatch.setattr(profile, "_sleep", waited.append)
    set_phone(phone_env.folder, thermal={"status": 2, "temperatures": {"cpu-1-0": [0, 47.0], "skin": [3, 41.5]}},
              toybox_time=False)  # an older toybox without time: profiled all the same, no peak memory
    result = run_doit(phone_env.repo, "profile:tinynet/w8a16@s25")
    assert result.code == 0, result.output
    record = json.loads((phone_env.repo / "out/tinynet/w8a16/SM8750/profile.s25.json").read_text())
    assert waited == [45.0] and record["cooldown_seconds"] == 45.0  # two graphs, no CPU baseline: one wait
    assert record["peak_memory"] == ("no peak memory: `/system/bin/time -v echo` gave exit 127: /system/bin/sh: "
                                     "/system/bin/time: inaccessible or not found")
    assert all(t["peak_memory_kib"] is None for t in record["graphs"].values())
    assert not any("/system/bin/time" in c for c in _net_runs(phone_env.calls()))
    assert "   profile:tinynet/w8a16@s25: cool-down 45 s (thermal moderate (cpu 47.0 C, skin 41.5 C))" in result.output
    for t in record["graphs"].values():
        assert t["thermal"]["after"] == {"available": True, "status": 2, "status_name": "moderate", "cpu_max_c": 47.0,
                                         "skin_max_c": 41.5, "temperatures": {
                                             "cpu-1-0": {"celsius": 47.0, "type": "cpu"},
                                             "skin": {"celsius": 41.5, "type": "skin"}}}
        assert "throttled: thermal status moderate (2) after the run" in t["flags"]
    summary = next(line for line in result.output.splitlines() if line.startswith("  phone       profile:"))
    assert summary.count("throttled") == 2 and summary.endswith("; burst, native I/O")
    # the inputs pushed are the evaluation samples in the binary's own fixed point, as an app hands them over
    contract = contract_from_ctx(phone_env.repo / "out/tinynet/w8a16/SM8750/encoder_ctx.onnx")
    tensor = contract["inputs"][0]
    assert tensor["dtype"] == "UFIXED_POINT_16"
    first = load_evaluation(str(phone_env.repo / "out/tinynet/float/encoder.evaluation.npz"))[0][0]["image"]
    pushed = phone_env.folder / "fs/data/local/tmp/build_rules/inputs/tinynet/w8a16/SM8750/encoder/native/0000.image.raw"
    assert np.array_equal(np.fromfile(pushed, dtype=np.uint16), quantize(first.astype(np.float32), tensor).reshape(-1))

    # A later profile that fails keeps these numbers and their raw logs, marked stale (as device_check and power
    # do; it deleted them at its start): the phone's runtime loses its stub after the push
    from build_rules.device import on_phone
    result_path = phone_env.repo / "out/tinynet/w8a16/SM8750/profile.s25.json"
    logs = sorted(str(p.relative_to(result_path.with_suffix(""))) for p in result_path.with_suffix("").rglob("*"))
    assert logs
    original = on_phone.push_runtime_and

    def push_then_lose_the_stub(phone, more):
        pushed = original(phone, more)
        (phone_env.folder / "fs/data/local/tmp/build_rules/runtime/libQnnHtpV79Stub.so").unlink(missing_ok=True)
        return pushed
    monkeypatch.setattr(on_phone, "push_runtime_and", push_then_lose_the_stub)
    failed = run_doit(phone_env.repo, "profile:tinynet/w8a16@s25")
    assert failed.code != 0 and "Unable to load backend" in failed.output, failed.output
    kept = json.loads(result_path.read_text())
    assert kept["graphs"] == record["graphs"] and kept["seconds"] == record["seconds"]
    assert kept["stale"]["why"].startswith("the last run failed: [ ERROR ] Unable to load backend"), kept["stale"]
    assert sorted(str(p.relative_to(result_path.with_suffix(""))) for p in result_path.with_suffix("").rglob("*")) \
        == logs and not result_path.with_name("profile.s25.new").exists()


def test_the_stand_in_qnn_net_run_checks_the_backend_extension_config_and_warns_on_perf_profile(phone_env):
    """As QNN's docs give --config_file; --perf_profile is deprecated for HTP (a warning, not a refusal)."""
    import shutil

    from build_rules.device import runtime as qnn_runtime
    from build_rules.device.adb import Adb
    from build_rules.device.session import net_run
    fs = phone_env.folder / "fs"
    remote = fs / "data/local/tmp/build_rules/runtime"
    remote.mkdir(parents=True)
    for name, path in qnn_runtime.files(Path(os.environ["BUILD_RULES_QNN_RUNTIME"]), "v79", "test").items():
        shutil.copy(path, remote / name)
    config = fs / "data/local/tmp/build_rules/config"
    config.mkdir(parents=True)
    (config / "htp.json").write_text(json.dumps({"devices": [{"device_id": 0, "cores": [{"core_id": 0,
                                                                                          "perf_profile": "turbo"}]}]}))
    library = "/data/local/tmp/build_rules/runtime/libQnnHtpNetRunExtensions.so"
    (config / "netrun.json").write_text(json.dumps({"backend_extensions": {
        "shared_library_path": library, "config_file_path": "/data/local/tmp/build_rules/config/htp.json"}}))
    phone = Adb(SERIAL, "s25")

    def run(*flags):
        return phone.shell_code(net_run("/data/local/tmp/build_rules/missing.bin", "list.txt", "out", *flags))
    code, said = run("--config_file", "/data/local/tmp/build_rules/config/netrun.json")
    assert code == 1 and f'Unable to load backend extensions library: dlopen failed: library "{library}" not found' \
        in said
    (remote / "libQnnHtpNetRunExtensions.so").write_text("stand-in\n")
    code, said = run("--config_file", "/data/local/tmp/build_rules/config/netrun.json")
    assert code == 1 and "/data/local/tmp/build_rules/config/htp.json: unknown perf_profile 'turbo'" in said
    code, said = run("--perf_profile", "burst")
    assert code == 1 and "[ WARNING ] --perf_profile is deprecated for the HTP backend" in said
    assert "Could not open /data/local/tmp/build_rules/missing.bin" in said  # it went on after the warning


def test_a_bad_cooldown_fails_before_touching_the_phone(phone_env, monkeypatch):
    monkeypatch.setenv("BUILD_RULES_PROFILE_COOLDOWN", "1 min")
    result = run_doit(phone_env.repo, "profile:tinynet/fp16@s25")
    assert result.code != 0
    assert ("profile:tinynet/fp16@s25: BUILD_RULES_PROFILE_COOLDOWN='1 min': give a number >= 0 (unset: 0)"
            in result.output)
    assert phone_env.calls() == []


def test_profile_announces_the_last_profiles_time(tmp_path):
    from build_rules.device.profile import _last_seconds
    result = tmp_path / "profile.s25.json"
    assert _last_seconds(result) == ""  # never profiled here
    result.write_text(json.dumps({"seconds": 31.4, "graphs": {"encoder": {"runs": 20}, "head": {"runs": 20}}}))
    assert _last_seconds(result) == "; the last profile here took 31 s (20 runs)"


def test_thermal_reading_and_the_judgement_of_a_run():
    from build_rules.device import thermal

    class Phone:
        def __init__(self, code, text):
            self.answer = (code, text)

        def shell_code(self, command):
            assert command == "dumpsys thermalservice"
            return self.answer
    text = ("IsStatusOverride: false\nThermal Status: 1\nCached temperatures:\n\tTemperature{mValue=30.0, mType=3, "
            "mName=skin, mStatus=0}\nHAL Ready: true\nCurrent temperatures from HAL:\n\tTemperature{mValue=44.25, "
            "mType=0, mName=cpu-0-0, mStatus=1}\n\tTemperature{mValue=46.5, mType=0, mName=cpu-1-0, mStatus=1}\n"
            "\tTemperature{mValue=36.0, mType=3, mName=skin, mStatus=0}\nCurrent cooling devices from HAL:\n")
    reading = thermal.read(Phone(0, text))
    assert (reading["status"], reading["status_name"], reading["cpu_max_c"], reading["skin_max_c"]) == \
        (1, "light", 46.5, 36.0)  # the HAL's current values, not the cached ones
    assert thermal.read(Phone(0, "Can't find service: thermalservice\n")) == {
        "available": False, "reason": "`dumpsys thermalservice` gave no 'Thermal Status' (exit 0): Can't find "
                                      "service: thermalservice"}
    cool = {"available": True, "status": 0, "status_name": "none"}
    assert thermal.judge(2.0, 2.9, cool, cool) == []  # 1.45x: within the 1.5x limit
    assert thermal.judge(2.0, 3.2, cool, cool) == ["noisy: p90 3.2 ms is 1.60x the median 2 ms (> 1.5x)"]
    assert thermal.judge(2.0, 3.2, cool, cool, spread_limit=2.0) == []
    assert thermal.judge(2.0, 2.0, cool, reading) == ["throttled: thermal status light (1) after the run"]
    assert thermal.judge(2.0, 2.0, {"available": False}, {"available": False}) == []


def test_the_perf_profile_form_goes_by_the_runtime_version(tmp_path):
    from build_rules.device import perf_config
    from build_rules.device.errors import DeviceError
    runtime = make_runtime(tmp_path / "qairt" / "2.40.0.251030")
    remote = "/data/local/tmp/build_rules/runtime"
    for old in ("2.38.0", None):  # older than the docs read here, or no sdk.yaml: the flag every version takes
        assert perf_config.request(old, "burst", runtime, tmp_path / "c", remote, "profile:x") == \
            (("--perf_profile", "burst"), {}, "--perf_profile")
    flags, files, form = perf_config.request("2.51.0", "sustained_high_performance", runtime, tmp_path / "c", remote,
                                             "profile:x")
    assert flags == ("--config_file", "/data/local/tmp/build_rules/config/netrun_sustained_high_performance.json")
    assert json.loads(files[flags[1]].read_text()) == {"backend_extensions": {
        "shared_library_path": f"{remote}/libQnnHtpNetRunExtensions.so",
        "config_file_path": "/data/local/tmp/build_rules/config/htp_perf_sustained_high_performance.json"}}
    assert files[f"{remote}/libQnnHtpNetRunExtensions.so"] == \
        runtime / "lib/aarch64-android/libQnnHtpNetRunExtensions.so"
    (runtime / "lib/aarch64-android/libQnnHtpNetRunExtensions.so").unlink()
    with pytest.raises(DeviceError) as e:
        perf_config.request("2.51.0", "burst", runtime, tmp_path / "c", remote, "profile:x")
    assert str(e.value) == (f"profile:x: the QNN runtime at {runtime} (QAIRT 2.51.0) lacks "
                            "lib/aarch64-android/libQnnHtpNetRunExtensions.so: its qnn-net-run takes the HTP "
                            "performance profile through that backend extension (--perf_profile is deprecated for "
                            "HTP); copy it from the same QAIRT SDK")


def _battery(folder: Path) -> dict:
    return json.loads((folder / "battery.json").read_text())


def test_power_measures_drain_and_cpu_share_and_resets_the_battery(phone_env, monkeypatch, tmp_path):
    # 6 s a loop: the stand-in phone's shell is a process per command, and at load 8 (fresh27) a 4 s loop got
    # fewer than the two reads of /proc/<pid>/stat a CPU share needs
    monkeypatch.setenv("BUILD_RULES_POWER_SECONDS", "6")
    # a read of the loop's /proc/<pid>/stat every 0.2 s: at 1 s, a loaded machine (load 7, the stand-in phone's
    # shell a process per read) gave one read in the 4 s loop and no CPU share (issue 46: tests pass loaded too)
    monkeypatch.setenv("BUILD_RULES_POWER_SAMPLE", "0.2")
    monkeypatch.setenv("BUILD_RULES_CPU_RUNTIME", str(make_cpu_runtime(tmp_path / "cpu-runtime")))
    monkeypatch.setenv("BUILD_RULES_PROGRESS_SECONDS", "0.5")
    result = run_doit(phone_env.repo, "power:tinynet/w8a16@s25")
    assert result.code == 0, result.output
    # the duration is said when it starts (the default of 30 min per path was not), and the time left as it runs
    assert ("   power:tinynet/w8a16@s25: 2 loop(s) (NPU, CPU) of 6.0 s each (BUILD_RULES_POWER_SECONDS=6): about "
            "12 s on the phone; Ctrl-C stops it and restores the battery state\n") in result.output
    left = [float(x) for x in re.findall(r"^   power:tinynet/w8a16@s25: NPU loop \S+ s of 6\.0 s, (\S+) s left",
                                         result.output, re.M)]
    assert left and all(6.0 <= x < 12.0 for x in left)  # the CPU path's 6 s still to come
    record = json.loads((phone_env.repo / "out/tinynet/w8a16/SM8750/power.s25.json").read_text())
    npu = record["npu"]
    assert npu["mah_per_hour"] == pytest.approx(150 * 3600 / 1000, rel=0.05)  # the stand-in's 150 uAh/s
    assert npu["cpu_percent_samples"] and npu["cpu_percent_mean"] > 5  # the emulator loop is busy on the host CPU
    cpu = record["cpu"]  # the float graph's loop through ort-cpu-run: its own pid (the loader execs it)
    assert cpu["measured"] is True and cpu["mah_per_hour"] == pytest.approx(150 * 3600 / 1000, rel=0.05)
    assert cpu["cpu_percent_samples"] and cpu["cpu_percent_mean"] > 5
    assert "screen off (or the same brightness)" in record["hold_fixed"]
    # burst through the backend extension config on the 2.40 runtime, as profile asks (--perf_profile: deprecated)
    loops = [c for c in _net_runs(phone_env.calls()) if "--duration 6" in c]
    assert loops and all("--config_file /data/local/tmp/build_rules/config/netrun_burst.json" in c for c in loops)
    assert not any("--perf_profile" in c for c in loops)
    assert record["perf_profile"] == "burst" and record["perf_profile_form"] == "backend extension config"
    assert _battery(phone_env.folder)["unplugged"] is False
    shells = [" ".join(c) for c in phone_env.calls() if "shell" in c]
    assert any("dumpsys battery unplug" in s for s in shells) and "dumpsys battery reset" in shells[-1]
    assert run_doit(phone_env.repo, "report").code == 0
    table = (phone_env.repo / "out/tinynet/report.md").read_text().split("## Power on phones", 1)[1]
    assert f"| w8a16 | SM8750 | s25 | NPU | {npu['seconds']:.4g} | " in table
    # power's numbers in the summary of the task's own run
    assert (f"  phone       power:tinynet/w8a16@s25: NPU {npu['mah_per_hour']:.4g} mAh/h over {npu['seconds']} s, "
            f"CPU {cpu['mah_per_hour']:.4g} mAh/h over {cpu['seconds']} s\n") in result.output
    assert f"| w8a16 | SM8750 | s25 | CPU | {cpu['seconds']:.4g} | " in table


def test_the_drain_is_over_the_phones_seconds_whatever_adbs_latency():
    """power reads the charge and the phone's clock (/proc/uptime) in one command: an answer that reaches the host a
    second late does not stretch or shrink the interval (the host's clock did: a 4 s loop read 16 % high once)."""
    import time

    from build_rules.device import power

    class LatePhone:  # drains 150 uAh/s on its own clock; its first answer reaches the host 1 s late
        name, reads, started = "late", 0, time.monotonic()

        def shell(self, command: str) -> str:
            assert command == f"cat {power.BATTERY}/charge_counter {power.BATTERY}/capacity /proc/uptime"
            now = time.monotonic()
            self.reads += 1
            if self.reads == 1:
                time.sleep(1.0)
            return f"{int(3_000_000 - 150 * (now - self.started))}\n80\n{now:.2f} 1.00\n"
    phone = LatePhone()
    before = power.battery(phone)
    time.sleep(1.0)
    after = power.battery(phone)
    rate = (before["charge_counter_uah"] - after["charge_counter_uah"]) / (after["time"] - before["time"])
    assert rate == pytest.approx(150, rel=0.02)  # the host's clock gave ~300 here


class _SlowShellPhone:
    """A phone on a simulated clock whose every adb command takes `latency` s (a busy host's round trip), running
    one loop that lives `lives` s from its start."""
    name, serial = "slow", "slow"

    def __init__(self, latency: float, lives: float):
        self.clock, self.latency, self.lives, self.started, self.log = 100.0, latency, lives, None, []

    def monotonic(self) -> float:
        return self.clock

    def sleep(self, seconds: float) -> None:
        self.clock += seconds

    def shell_code(self, command: str, timeout: float | None = None) -> tuple[int, str]:
        self.log.append(command)
        self.clock += self.latency / 2  # the command reaches the phone half-way through the round trip ...
        seen = self.clock
        self.clock += self.latency / 2  # ... and its answer the host at the end
        if command.startswith("getconf"):
            return 0, "100\n"
        if "echo PID=$!" in command:
            self.started = seen
            return 0, "PID=4242\n"
        if command.startswith("cat /proc/4242/stat"):
            if seen >= self.started + self.lives:
                return 1, "cat: /proc/4242/stat: No such file or directory\n"
            ticks = int((seen - self.started) * 100)
            return 0, "4242 (qnn-net-run) S " + " ".join(["0"] * 10) + f" {ticks} 0 " + " ".join(["0"] * 37) + "\n"
        if "charge_counter" in command:
            return 0, f"{int(3_000_000 - 100 * seen)}\n80\n{seen:.2f} 1.00\n"
        if command.startswith("cat "):  # the loop's log
            return 0, "[ ERROR ] the loop's own last line\n"
        return 0, ""

    def shell(self, command: str, timeout: float | None = None) -> str:
        return self.shell_code(command, timeout)[1]


@pytest.mark.parametrize("lives, passes", [(6.0, True), (2.5, False)])
def test_a_power_loop_is_judged_by_what_it_lived_at_most_whatever_adbs_latency(monkeypatch, lives, passes):
    """fresh32: on a busy host a 6 s loop that ran its 6 s failed as 'ended after 5.1 s': its last sighting came an
    adb round trip before its end. The loop is judged by the read that finds it gone; one that really ends early
    still fails."""
    import types

    from build_rules.device import power
    from build_rules.device.errors import DeviceError
    phone = _SlowShellPhone(latency=0.9, lives=lives)
    monkeypatch.setattr(power, "time", types.SimpleNamespace(monotonic=phone.monotonic))
    monkeypatch.setattr(power, "_sleep", phone.sleep)
    if passes:
        result = power.loop(phone, "qnn-net-run --duration 6", 6.0, 0.2)
        # the last read that saw it alive was more than one sampling interval before its end: the old judgement failed
        assert result["alive_seconds"] < 0.9 * 6.0 - 0.2
        assert result["cpu_percent_mean"] == pytest.approx(100.0)
        assert not any(command.startswith("kill") for command in phone.log)  # it ended on its own
    else:
        said = (r"^the NPU loop \(pid 4242, --duration 6\) ended within 3\.\d s of the 6 s asked: \[ ERROR \] the "
                r"loop's own last line \(its log: ")
        with pytest.raises(DeviceError, match=said):
            power.loop(phone, "qnn-net-run --duration 6", 6.0, 0.2)


def test_a_bad_power_or_profile_setting_is_one_line_naming_it(phone_env, monkeypatch):
    """BUILD_RULES_POWER_SECONDS and BUILD_RULES_PROFILE_RUNS are read while the phone tasks are made: a value that
    is not one is the setting's own line before any task, not a traceback through doit's loader."""
    for name, value, said in (
            ("BUILD_RULES_POWER_SECONDS", "30min", "error: BUILD_RULES_POWER_SECONDS='30min' is not a number of "
             "seconds > 0 (each power loop's length); unset it for the default 1800"),
            ("BUILD_RULES_POWER_SECONDS", "0", "error: BUILD_RULES_POWER_SECONDS='0' is not a number of seconds > 0"),
            ("BUILD_RULES_PROFILE_RUNS", "2.5", "error: BUILD_RULES_PROFILE_RUNS='2.5' is not a whole number of runs "
             ">= 1; unset it for the default 20"),
            # read as power's tasks were made, with float(): a bad one was a traceback through doit's loader
            ("BUILD_RULES_POWER_SAMPLE", "0", "error: BUILD_RULES_POWER_SAMPLE='0' is not a number of seconds > 0 "
             "(between two reads of a power loop's CPU time); unset it for the default 2"),
            ("BUILD_RULES_POWER_SAMPLE", "1s", "error: BUILD_RULES_POWER_SAMPLE='1s' is not a number of seconds")):
        monkeypatch.setenv(name, value)
        result = run_doit(phone_env.repo, "list")
        assert result.code == 3 and said in result.output and "Traceback" not in result.output, result.output
        monkeypatch.delenv(name)
    monkeypatch.setenv("BUILD_RULES_POWER_SECONDS", "90")
    result = run_doit(phone_env.repo, "list", "--all")
    assert result.code == 0 and "battery drain and CPU share over 90 s per path" in result.output, result.output


def remote_processes(phone: Path) -> list[int]:
    """pids of the stand-in phone's programs still running (they are host processes whose command line holds the
    phone's folder); a zombie counts as gone."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(phone) in cmdline and state not in ("Z", "X"):
            found.append(int(proc.name))
    return found


def gone(pids: list[int], seconds: float = 10.0) -> bool:
    """Every one of these pids ended (kill sends SIGTERM: a process ends a moment later)."""
    import time

    def alive(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except OSError:
            return False
    end = time.monotonic() + seconds
    while any(alive(pid) for pid in pids):
        if time.monotonic() > end:
            return False
        time.sleep(0.2)
    return True


def test_power_fails_when_the_loop_dies_at_once_with_its_logs_line(phone_env, monkeypatch):
    """qnn-net-run failed at once ("Unable to load backend"), yet the task passed with a 2.3 s row (issue 37)."""
    from build_rules.device import power, session
    monkeypatch.setenv("BUILD_RULES_POWER_SECONDS", "6")
    monkeypatch.setenv("BUILD_RULES_POWER_SAMPLE", "1")
    monkeypatch.setattr(power, "net_run", lambda *a, **k: session.net_run(*a, **k, backend="libQnnGpu.so"))
    result = run_doit(phone_env.repo, "power:tinynet/w8a16@s25")
    assert result.code != 0
    assert re.search(r"power:tinynet/w8a16@s25: the NPU loop \(pid \d+, --duration 6\) ended within \d\.\d s of the 6 s "
                     r"asked: \[ ERROR \] Unable to load backend\. dlerror\(\): dlopen failed: library "
                     r'"/data/local/tmp/build_rules/runtime/libQnnGpu.so" not found \(its log: '
                     r"/data/local/tmp/build_rules/power.npu.log on the phone\); nothing was recorded; the battery "
                     r"state was restored", result.output), result.output
    assert not (phone_env.repo / "out/tinynet/w8a16/SM8750/power.s25.json").exists()


def test_power_restores_the_battery_state_and_stops_the_loop_after_a_failure_ctrl_c_and_sigterm(phone_env,
                                                                                                 monkeypatch):
    import signal
    import time

    from build_rules.device import power
    monkeypatch.setenv("BUILD_RULES_POWER_SECONDS", "30")
    running = []  # the stand-in phone's loop, seen while it runs
    set_phone(phone_env.folder, battery={"level": 80, "charge_counter_uah": 3_000_000, "drain_uah_per_s": 150,
                                         "full_uah": 3_750_000, "sysfs": False})  # no /sys battery node: it fails
    original = power.battery

    def battery(phone):
        running.extend(remote_processes(phone_env.folder))
        return original(phone)
    monkeypatch.setattr(power, "battery", battery)
    result = run_doit(phone_env.repo, "power:tinynet/w8a16@s25")
    assert result.code != 0
    assert ("power:tinynet/w8a16@s25: on s25 (R5CX1234ABC): `cat /sys/class/power_supply/battery/charge_counter"
            in result.output)
    assert "the battery state was restored (dumpsys battery reset)" in result.output
    assert "power:tinynet/w8a16@s25: stopped the loop (pid " in result.output
    assert _battery(phone_env.folder)["unplugged"] is False
    assert not (phone_env.repo / "out/tinynet/w8a16/SM8750/power.s25.json").exists()
    assert running and gone(running), running  # the loop ran when the battery read failed; it is gone now
    monkeypatch.setattr(power, "battery", original)

    set_phone(phone_env.folder, battery={"level": 80, "charge_counter_uah": 3_000_000, "drain_uah_per_s": 150,
                                         "full_uah": 3_750_000})  # the node back: now a Ctrl-C, then a SIGTERM
    for stop in ("ctrl-c", "sigterm"):
        running.clear()

        def interrupted(seconds):
            running.extend(remote_processes(phone_env.folder))
            if stop == "ctrl-c":
                raise KeyboardInterrupt
            os.kill(os.getpid(), signal.SIGTERM)  # as `kill <doit's pid>` does; power's handler raises
            time.sleep(5)
        monkeypatch.setattr(power, "_sleep", interrupted)
        with pytest.raises(KeyboardInterrupt):
            run_doit(phone_env.repo, "power:tinynet/w8a16@s25")
        assert _battery(phone_env.folder)["unplugged"] is False, stop
        assert "dumpsys battery reset" in " ".join(phone_env.calls()[-1]), stop
        assert running and gone(running), (stop, running)
        assert any(c[-1].startswith("kill ") for c in phone_env.calls() if "shell" in c), stop


AUDIO_HOOK = '''

def evaluate(run_graph):
    """An audio-like pipeline for the device tests: per 'clip' (an evaluation sample standing for 1.5 s of audio)
    the encoder once, then the head three times (as a step decoder runs once per token)."""
    clips = evaluation_inputs("encoder")
    for clip in clips:
        features = run_graph("encoder", clip)["features"]
        for _ in range(3):
            run_graph("head", {"features": features})
    return {"utterances": len(clips), "audio_seconds": 1.5 * len(clips)}
'''


@pytest.mark.slow
def test_profile_gives_the_real_time_factor_of_a_model_whose_evaluate_hook_runs_over_audio(phone_env, monkeypatch):
    repo = phone_env.repo
    monkeypatch.setenv("BUILD_RULES_PROFILE_RUNS", "5")
    (repo / "models/tinynet/hooks.py").write_text((repo / "models/tinynet/hooks.py").read_text() + AUDIO_HOOK)
    toml = repo / "models/tinynet/model.toml"
    toml.write_text(toml.read_text() + '\n[evaluate]\ngate = { metric = "utterances", min = 4 }\n')
    result = run_doit(repo, "profile:tinynet/fp16@s25")
    assert result.code == 0, result.output
    assert "evaluate:tinynet/float" in result.ran  # the audio duration and graph runs come from it
    record = json.loads((repo / "out/tinynet/fp16/SM8750/profile.s25.json").read_text())
    encoder, head = (record["graphs"][g]["median_ms"] for g in ("encoder", "head"))
    audio = record["realtime"]
    assert audio["measured"] is True and audio["audio_seconds"] == 6.0 and audio["utterances"] == 4
    assert audio["graph_runs"] == {"encoder": 4, "head": 12}  # counted by the evaluate stage, in first-run order
    assert audio["processing_ms"] == pytest.approx(4 * encoder + 12 * head)
    assert audio["rtf"] == pytest.approx((4 * encoder + 12 * head) / 6000.0)
    assert audio["first_output_ms"] == pytest.approx(encoder + head)
    assert audio["per_utterance_ms"] == pytest.approx(encoder + 3 * head)
    assert record["graphs"]["encoder"]["cpu"] == {"measured": False, "reason": NOT_SET}  # no CPU runtime named
    assert run_doit(repo, "report").code == 0
    text = (repo / "out/tinynet/report.md").read_text()
    table = text.split("Real-time factor on phones", 1)[1]
    row = next(line for line in table.splitlines() if line.startswith("| fp16 | SM8750 | s25 | "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3] == "6" and cells[4] == "encoder x4, head x12"
    assert float(cells[6]) == pytest.approx(audio["rtf"], rel=1e-3)
    assert float(cells[7]) == pytest.approx(audio["first_output_ms"], rel=1e-3)


def test_profile_of_a_model_without_audio_has_no_real_time_factor():
    from build_rules.device.realtime import realtime
    # an evaluate hook over images (no audio_seconds): no factor; a graph the phone did not time: said, not skipped
    assert realtime({"metrics": {"accuracy": 0.9}, "graph_runs": {"encoder": 4}}, {"encoder": 1.0}) is None
    assert realtime(None, {"encoder": 1.0}) is None
    missing = realtime({"metrics": {"audio_seconds": 6.0}, "graph_runs": {"encoder": 4, "decoder": 9}},
                       {"encoder": 1.0})
    assert missing == {"measured": False, "reason": "the evaluate hook runs decoder, which the phone did not time "
                                                    "(no latency for it in this profile)"}


@pytest.mark.slow
@pytest.mark.parametrize("flow", ["model-lib", "dlc"])
def test_qairt_binaries_are_checked_and_profiled_on_the_phone_through_their_own_contract(flow, tmp_path, monkeypatch):
    """The qairt toolchain's context binaries: the contract from _net.json (model-lib flow: channel-last inputs
    written as the converter made them) or <graph>.info.json (DLC flow: the ONNX layout). The stand-in SDK's binaries
    are not QNN artefacts: the stand-in phone runs their float ONNX model (as the stand-in SDK's qnn-net-run does),
    so the numbers show the plumbing only."""
    import numpy as np

    from conftest import TEST_MODELS, make_repo, write_tinynet_checkpoints
    from test_qairt_toolchain import use_sdk
    sdk = make_runtime(tmp_path / "qairt" / "2.40.0.251030")  # the stand-in SDK, with the phone's tools
    repo = make_repo(tmp_path / "repo", {"tinynet": TEST_MODELS / "tinynet"})
    write_tinynet_checkpoints(repo / "models" / "tinynet")
    use_sdk(monkeypatch, sdk, tmp_path / "calls.jsonl")
    monkeypatch.delenv("BUILD_RULES_QNN_RUNTIME", raising=False)  # the runtime comes from QNN_SDK_ROOT
    monkeypatch.setenv("BUILD_RULES_QAIRT_FLOW", flow)
    env = plug_phone(repo, tmp_path, monkeypatch)
    result = run_doit(repo, CHECK)
    assert result.code == 0, result.output
    assert "convert:tinynet/encoder/w8a16" in result.ran and "compile:tinynet/encoder/w8a16@SM8750" in result.ran
    record = json.loads((repo / RESULT).read_text())
    assert record["toolchain"] == "qairt" and record["passed"] is True and record["parts"] is None
    assert record["summary"]["cosine"] > 0.99999  # the stand-in ran the float model: the layouts round-tripped
    pushed = env.folder / "fs/data/local/tmp/build_rules/inputs/tinynet/encoder/0000.image.raw"
    from build_rules.measuring.samples import load_evaluation
    first = load_evaluation(str(repo / "out/tinynet/float/encoder.evaluation.npz"))[0][0]["image"].reshape(1, 3, 16, 16)
    if flow == "model-lib":
        net_json = json.loads((repo / "out/tinynet/w8a16/encoder_net.json").read_text())
        assert net_json["graph"]["tensors"]["image"]["dims"] == [1, 16, 16, 3]  # channel-last on the QNN side
        first = first.transpose(0, 2, 3, 1)
    else:  # qairt-converter keeps the ONNX layout; the contract is the compiled binary's dump
        assert (repo / "out/tinynet/w8a16/SM8750/encoder.info.json").is_file()
        assert not (repo / "out/tinynet/w8a16/encoder_net.json").exists()
    assert np.array_equal(np.fromfile(pushed, dtype=np.float32), np.ascontiguousarray(first).reshape(-1))
    runs = _net_runs(env.calls())  # twice: does the phone repeat itself
    assert len(runs) == 2 and all("/bin/tinynet/w8a16/SM8750/encoder.bin" in r for r in runs)
    profile = run_doit(repo, "profile:tinynet/w8a16@s25")
    assert profile.code == 0, profile.output
    timed = json.loads((repo / "out/tinynet/w8a16/SM8750/profile.s25.json").read_text())
    for t in timed["graphs"].values():
        assert t["runs"] == 20 and 0 < t["median_ms"] <= t["p90_ms"] and t["load_ms"] > 0
        assert t["io"].startswith("float32: ")  # no encodings in a qairt contract here: said, not hidden


SPLIT_CHECK = "device_check:tinynet/encoder/fp16@s25"
SPLIT_TOML = 'gate = { metric = "cosine", min = 0.99 }\nsplit = { parts = 2 }'


def test_a_split_graph_runs_its_parts_in_order_on_the_phone(phone_env, monkeypatch):
    # fp16: a QDQ model's cut is test_split's subject. The cut tensor is /Relu_output_0 (torchscript's name):
    # qnn-net-run writes it to Result_<n>/Relu_output_0.raw, which the chain must read (target.result_file), not
    # /Relu_output_0.raw
    repo = phone_env.repo
    toml = repo / "models/tinynet/model.toml"
    text = toml.read_text()
    encoder_gate = 'calibration_samples = 8\ngate = { metric = "cosine", min = 0.99 }'
    assert encoder_gate in text
    toml.write_text(text.replace(encoder_gate, f"calibration_samples = 8\n{SPLIT_TOML}", 1))
    result = run_doit(repo, SPLIT_CHECK, "check:tinynet/encoder/fp16@SM8750")
    assert result.code == 0, result.output
    record = json.loads((repo / "out/tinynet/fp16/SM8750/encoder.device.s25.json").read_text())
    check = json.loads((repo / "out/tinynet/fp16/SM8750/encoder.check.json").read_text())
    assert record["parts"] == ["encoder.part1", "encoder.part2"] and set(record["binary_sha256"]) == set(record["parts"])
    # the chain on the phone (part 1's outputs pulled and handed to part 2) gives the emulator chain's numbers
    assert record["summary"]["cosine"] == pytest.approx(check["summary"]["cosine"], abs=1e-5)
    runs = _net_runs(phone_env.calls())
    assert [r.split("--retrieve_context ")[1].split()[0].rsplit("/", 1)[1] for r in runs] == \
        ["encoder.part1.bin", "encoder.part2.bin"] * 2  # the parts in order, twice: does the phone repeat itself
    part2 = [Path(c[-1]).name for c in _pushes(phone_env.calls()) if any(a.endswith("input_list.txt") for a in c)]
    assert part2 == ["encoder", "encoder.part2"]  # the evaluation set's list, then part 2's from part 1's outputs
    monkeypatch.setenv("BUILD_RULES_PROFILE_RUNS", "4")
    profile = run_doit(repo, "profile:tinynet/fp16@s25")
    assert profile.code == 0, profile.output
    encoder = json.loads((repo / "out/tinynet/fp16/SM8750/profile.s25.json").read_text())["graphs"]["encoder"]
    parts = encoder["parts"]
    assert list(parts) == ["encoder.part1", "encoder.part2"] and encoder["sum_of_parts"] is True
    assert encoder["median_ms"] == pytest.approx(sum(p["median_ms"] for p in parts.values()))
    assert encoder["load_ms"] == pytest.approx(sum(p["load_ms"] for p in parts.values()))
    assert all(p["runs"] == 4 and p["median_ms"] > 0 for p in parts.values())
    assert encoder["warm_load_ms"] == pytest.approx(sum(p["warm_load_ms"] for p in parts.values()))
    assert encoder["peak_memory_kib"] == max(p["peak_memory_kib"] for p in parts.values())
    assert encoder["throughput_per_s"] == pytest.approx(1000 / encoder["median_ms"])
    # part 2's native inputs: part 1's native outputs, dequantized on the host and written in part 2's types
    native = phone_env.folder / "fs/data/local/tmp/build_rules/inputs/tinynet/fp16/SM8750/encoder.part2/native"
    assert (native / "input_list.txt").is_file() and encoder["io"].startswith("native: ")


def test_ort_cpu_run_gives_the_float_models_outputs(tinynet_repo, tmp_path):
    """The CPU baseline's runner (build_rules/device/ort_cpu_run.c), built for this host against the real ONNX
    Runtime, over the encoder's evaluation inputs: the float reference's outputs, one timing row per inference."""
    import numpy as np

    from build_rules.measuring.samples import load_evaluation
    runtime = make_cpu_runtime(tmp_path / "cpu-runtime")
    inputs, reference = load_evaluation(str(tinynet_repo / "out/tinynet/float/encoder.evaluation.npz"))
    lines = []
    for i, sample in enumerate(inputs):
        sample["image"].astype(np.float32).tofile(tmp_path / f"{i}.raw")
        lines.append(f"image:={tmp_path / f'{i}.raw'}")
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    done = subprocess.run([str(runtime / "ort-cpu-run"), "--model", str(tinynet_repo / "out/tinynet/float/encoder.sim.onnx"),
                           "--input_list", str(tmp_path / "list.txt"), "--output_dir", str(tmp_path / "out"),
                           "--input", "image=1x3x16x16:float32", "--output", "features=1x64", "--num_inferences", "7"],
                          capture_output=True, text=True, env=dict(os.environ, LD_LIBRARY_PATH=str(
                              tmp_path / "cpu-runtime.host-lib")))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ort-cpu-run: 7 inference(s) of ") and "ONNX Runtime 1." in done.stdout
    for i, expected in enumerate(reference):
        got = np.fromfile(tmp_path / f"out/Result_{i}/features.raw", dtype=np.float32)
        assert np.allclose(got, expected["features"].reshape(-1), atol=1e-5)
    rows = (tmp_path / "out/timings.csv").read_text().splitlines()
    assert rows[0] == "event,microseconds" and rows[1].startswith("load,") and len(rows) == 2 + 7
    bad = subprocess.run([str(runtime / "ort-cpu-run"), "--model", "m.onnx", "--input_list", str(tmp_path / "list.txt"),
                          "--input", "image=1x3x16x8:float32", "--output", "features=1x64"], capture_output=True,
                         text=True, env=dict(os.environ, LD_LIBRARY_PATH=str(tmp_path / "cpu-runtime.host-lib")))
    assert bad.returncode == 1
    assert f"ort-cpu-run: wrong input size: {tmp_path / '0.raw'} holds 3072 bytes, its input needs 1536" in bad.stderr


def test_ort_cpu_run_writes_an_output_whose_name_holds_slashes_where_the_host_reads_it(tmp_path):
    """torchscript names an unnamed output "/head/Relu_output_0": ort-cpu-run failed to open Result_0//head/... (no
    such folder) and the CPU path of profile and power with it; it is written as target.result_file reads it."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    from build_rules.device.target import result_file
    name = "/head/Relu_output_0"
    graph = helper.make_graph([helper.make_node("Relu", ["x"], [name])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    runtime = make_cpu_runtime(tmp_path / "cpu-runtime")
    np.array([[-1.0, 2.0, -3.0, 4.0]], dtype=np.float32).tofile(tmp_path / "0.raw")
    (tmp_path / "list.txt").write_text(f"x:={tmp_path / '0.raw'}\n")
    done = subprocess.run([str(runtime / "ort-cpu-run"), "--model", str(tmp_path / "m.onnx"), "--input_list",
                           str(tmp_path / "list.txt"), "--output_dir", str(tmp_path / "out"), "--input",
                           "x=1x4:float32", "--output", f"{name}=1x4"], capture_output=True, text=True,
                          env=dict(os.environ, LD_LIBRARY_PATH=str(tmp_path / "cpu-runtime.host-lib")))
    assert done.returncode == 0, done.stderr
    got = np.fromfile(result_file(tmp_path / "out", 0, name), dtype=np.float32)
    assert got.tolist() == [0.0, 2.0, 0.0, 4.0]


def test_a_half_made_cpu_runtime_fails_before_touching_the_phone(phone_env, monkeypatch, tmp_path):
    folder = make_cpu_runtime(tmp_path / "cpu-runtime")
    (folder / "libstdc++.so.6").unlink()
    (folder / "ld-linux-aarch64.so.1").unlink()
    monkeypatch.setenv("BUILD_RULES_CPU_RUNTIME", str(folder))
    result = run_doit(phone_env.repo, "profile:tinynet/fp16@s25")
    assert result.code != 0
    assert (f"profile:tinynet/fp16@s25: BUILD_RULES_CPU_RUNTIME={folder} lacks ld-linux-aarch64.so.1, libstdc++.so.6: "
            f"make the folder with `python -m build_rules.device cpu-runtime {folder}`") in result.output
    assert phone_env.calls() == []

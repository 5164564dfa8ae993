"""Stand-in `adb` (see make_phone.py): the subset of adb the device tasks use, with real adb's outputs and exit codes.

Formats (Android platform-tools 35): `adb devices -l` prints 'List of devices attached', then per device the serial
padded to 22 columns, the state, then ' usb:<path> product:<p> model:<m> device:<d> transport_id:<n>', then an empty
line. A serial not connected: "adb: device '<serial>' not found" on stderr, exit 1; no device: "adb: no
devices/emulators found"; several without -s: "adb: more than one device/emulator". `adb shell` returns the remote
command's exit code (shell protocol). push: `push [--sync] [-n] [-z ALG] [-Z] LOCAL... REMOTE` (push());
pull of a missing path: "adb: error: failed to stat remote object '<path>': No such file or directory", exit 1.
"""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path


def _phones() -> Path:
    return Path(os.environ["FAKE_ADB_PHONES"])


def _log(argv: list[str]) -> None:
    log = os.environ.get("FAKE_ADB_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"argv": argv, "time": time.time()}) + "\n")


def _err(message: str, code: int = 1) -> int:
    print(message, file=sys.stderr)
    return code


class Phone:
    def __init__(self, folder: Path):
        self.folder = folder
        self.data = json.loads((folder / "phone.json").read_text())
        self.serial = self.data["serial"]
        self.fs = folder / "fs"

    @property
    def gone(self) -> bool:
        return (self.folder / "gone").exists()

    def host(self, path: str, cwd: str = "/") -> Path:
        path = path if path.startswith("/") else f"{cwd.rstrip('/')}/{path}"
        path = os.path.normpath(path)
        if path.startswith("/proc/") or path == "/dev/null":
            return Path(path)
        return self.fs / path.lstrip("/")


def _connected() -> list[Phone]:
    root = _phones()
    return [Phone(p) for p in sorted(root.iterdir()) if (p / "phone.json").is_file() and not (p / "gone").exists()]


def main(argv: list[str]) -> int:
    _log(argv)
    serial = None
    args = list(argv)
    while args and args[0] in ("-s", "-d", "-e"):
        if args[0] == "-s":
            if len(args) < 2:
                return _err("adb: -s requires an argument")
            serial = args[1]
            args = args[2:]
        else:
            args = args[1:]
    if not args:
        return _err("adb: usage: no command specified")
    command, rest = args[0], args[1:]
    if command == "devices":
        return devices("-l" in rest)
    if command == "version":
        print("Android Debug Bridge version 1.0.41\nVersion 35.0.2-12147458 (stand-in)")
        return 0
    if command not in ("shell", "push", "pull"):
        return _err(f"adb: unknown command {command}")
    connected = _connected()
    if serial is None:
        if not connected:
            return _err("adb: no devices/emulators found")
        if len(connected) > 1:
            return _err("adb: more than one device/emulator")
        phone = connected[0]
    else:
        phone = next((p for p in connected if p.serial == serial), None)
        if phone is None:
            return _err(f"adb: device '{serial}' not found")
    trigger = phone.data.get("unplug_when")
    if trigger and trigger in " ".join(argv):
        (phone.folder / "gone").write_text("unplugged\n")
        return _err(f"adb: device '{phone.serial}' not found")
    hang = phone.data.get("hang_when")
    if hang and hang in " ".join(argv):  # a phone that stopped answering (adb waits for it without end)
        time.sleep(3600)
    if phone.data["state"] == "unauthorized":
        return _err("adb: device unauthorized.\nThis adb server's $ADB_VENDOR_KEYS is not set\nTry 'adb "
                    "kill-server' if that seems wrong.\nOtherwise check for a confirmation dialog on your device.")
    if phone.data["state"] != "device":
        return _err("adb: device offline")
    if command == "push":
        return push(phone, rest)
    if command == "pull":
        return pull(phone, rest)
    return Shell(phone).run(" ".join(rest))


def devices(long: bool) -> int:
    print("List of devices attached")
    for i, phone in enumerate(_connected(), start=1):
        if not long:
            print(f"{phone.serial}\t{phone.data['state']}")
            continue
        props = phone.data["props"]
        if phone.data["state"] != "device":
            print(f"{phone.serial:<22} {phone.data['state']} usb:1-{i} transport_id:{i}")
            continue
        model = "".join(c if c.isalnum() else "_" for c in props["ro.product.model"])
        print(f"{phone.serial:<22} device usb:1-{i} product:{props['ro.product.name']} model:{model} "
              f"device:{props['ro.product.device']} transport_id:{i}")
    print()
    return 0


def push(phone: Phone, args: list[str]) -> int:
    """`push [--sync] [-n] [-z ALGORITHM] [-Z] LOCAL... REMOTE` (adb's help text). Several LOCALs, or a LOCAL folder
    into an existing folder, need REMOTE to be a folder on the phone; a folder is copied whole (into REMOTE/<name> when
    REMOTE is a folder). adb creates the missing parent folders of a target and gives the remote file the local
    mtime; --sync skips a file the phone has with the same size and mtime ("only push files that are newer on the
    host than the device")."""
    sync = dry = False
    rest = list(args)
    paths = []
    while rest:
        arg = rest.pop(0)
        if arg == "--sync":
            sync = True
        elif arg == "-n":
            dry = True
        elif arg == "-Z":
            continue
        elif arg == "-z":
            if not rest or rest.pop(0) not in ("any", "none", "brotli", "lz4", "zstd"):
                return _err("adb: error: -z requires an algorithm (any, none, brotli, lz4, zstd)")
        elif arg.startswith("-") and len(arg) > 1:
            return _err(f"adb: error: unknown option {arg} (push [--sync] [-z ALGORITHM] [-Z] LOCAL... REMOTE)")
        else:
            paths.append(arg)
    if len(paths) < 2:
        return _err("adb: usage: push requires an argument")
    *locals_, remote = paths
    target = phone.host(remote)
    for local in locals_:
        if not Path(local).exists():
            return _err(f"adb: error: cannot stat '{local}': No such file or directory")
    if len(locals_) > 1 and not target.is_dir():
        return _err(f"adb: error: target '{remote}' is not a directory")
    started = time.perf_counter()
    pushed = skipped = size = 0
    for local in map(Path, locals_):
        base = target / local.name if (target.is_dir() or remote.endswith("/")) else target
        pairs = [(f, base / f.relative_to(local)) for f in sorted(local.rglob("*")) if f.is_file()] \
            if local.is_dir() else [(local, base)]
        count = 0
        for source, dest in pairs:
            st = source.stat()
            if sync and dest.is_file() and dest.stat().st_size == st.st_size and \
                    int(dest.stat().st_mtime) == int(st.st_mtime):
                skipped += 1
                continue
            if not dry:
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, dest)
                os.chmod(dest, st.st_mode & 0o777)
                os.utime(dest, (st.st_mtime, st.st_mtime))
            count += 1
            size += st.st_size
        pushed += count
        print(f"{local}: {count} file{'s' if count != 1 else ''} pushed, 0 skipped.")
    seconds = max(time.perf_counter() - started, 1e-4)
    print(f"{pushed} file{'s' if pushed != 1 else ''} pushed, {skipped} skipped. {size / seconds / 1e6:.1f} MB/s "
          f"({size} bytes in {seconds:.3f}s)")
    return 0


def pull(phone: Phone, args: list[str]) -> int:
    if len(args) != 2:
        return _err("adb: pull requires an argument")
    remote, local = args[0], Path(args[1])
    source = phone.host(remote)
    if not source.exists():
        return _err(f"adb: error: failed to stat remote object '{remote}': No such file or directory")
    started = time.perf_counter()
    if source.is_dir():
        target = local / source.name if local.is_dir() else local
        shutil.copytree(source, target, dirs_exist_ok=True)
        count = sum(1 for p in source.rglob("*") if p.is_file())
        size = sum(p.stat().st_size for p in source.rglob("*") if p.is_file())
    else:
        target = local / source.name if local.is_dir() else local
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        count, size = 1, source.stat().st_size
    seconds = max(time.perf_counter() - started, 1e-4)
    print(f"{remote}: {count} file{'s' if count != 1 else ''} pulled, 0 skipped. {size / seconds / 1e6:.1f} MB/s "
          f"({size} bytes in {seconds:.3f}s)")
    return 0


# --- the phone's sh ---------------------------------------------------------------------------------------------

BATTERY = "/sys/class/power_supply/battery/"


class Shell:
    def __init__(self, phone: Phone):
        self.phone = phone
        self.cwd = "/"
        self.env = {"PATH": "/product/bin:/apex/com.android.runtime/bin:/system/bin:/system/xbin:/odm/bin:/vendor/bin"}
        self.status = 0
        self.last_background = ""

    def run(self, command: str) -> int:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
        commands, current = [], []
        for token in tokens:
            if token in ("&&", "||", ";", "&"):
                commands.append((current, token))
                current = []
            else:
                current.append(token)
        if current:
            commands.append((current, ";"))
        skip = False
        for words, op in commands:
            if not skip and words:
                self.status = self.simple([self.expand(w) for w in words], background=op == "&")
            skip = (op == "&&" and self.status != 0) or (op == "||" and self.status == 0)
        sys.stdout.flush()
        return self.status

    def expand(self, word: str) -> str:
        return word.replace("$?", str(self.status)).replace("$!", self.last_background)

    def simple(self, words: list[str], background: bool) -> int:
        stdout = stderr = None
        args, i = [], 0
        while i < len(words):
            w = words[i]
            if w in (">", "2>") or (w == "2" and i + 1 < len(words) and words[i + 1] in (">", ">&")):
                if w == "2":
                    i += 1
                    w = "2" + words[i]
                target = words[i + 1]
                if w in ("2>&", ">&") and target == "1":
                    stderr = "&1"
                elif w.startswith("2"):
                    stderr = target
                else:
                    stdout = target
                i += 2
                continue
            args.append(w)
            i += 1
        env = dict(self.env)
        while args and "=" in args[0] and args[0].split("=", 1)[0].isidentifier():
            key, value = args.pop(0).split("=", 1)
            env[key] = value
        if not args:
            self.env.update(env)
            return 0
        out = open(self.phone.host(stdout, self.cwd), "a") if stdout else sys.stdout
        err = out if stderr == "&1" else (open(self.phone.host(stderr, self.cwd), "a") if stderr else sys.stderr)
        try:
            return self.command(args, env, out, err, background)
        finally:
            for stream in {out, err} - {sys.stdout, sys.stderr}:
                stream.close()

    def command(self, args: list[str], env: dict, out, err, background: bool) -> int:
        name = args[0]
        if name == "nohup":
            return self.command(args[1:], env, out, err, background)
        if name == "cd":
            target = self.phone.host(args[1], self.cwd)
            if not target.is_dir():
                print(f"/system/bin/sh: cd: {args[1]}: No such file or directory", file=err)
                return 2
            self.cwd = os.path.normpath(args[1] if args[1].startswith("/") else f"{self.cwd}/{args[1]}")
            return 0
        if name == "export":
            for item in args[1:]:
                key, _, value = item.partition("=")
                self.env[key] = value
            return 0
        if name == "echo":
            print(" ".join(args[1:]), file=out)
            return 0
        if name == "getprop":
            print(self.phone.data["props"].get(args[1], "") if len(args) > 1 else "", file=out)
            return 0
        if name == "getconf":
            print(os.sysconf("SC_CLK_TCK") if args[1:] == ["CLK_TCK"] else "", file=out)
            return 0
        if name == "mkdir":
            for path in args[1:]:
                if path != "-p":
                    self.phone.host(path, self.cwd).mkdir(parents=True, exist_ok=True)
            return 0
        if name == "rm":
            for path in args[1:]:
                if not path.startswith("-"):
                    target = self.phone.host(path, self.cwd)
                    shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)
            return 0
        if name == "chmod":
            for path in args[2:]:
                os.chmod(self.phone.host(path, self.cwd), int(args[1], 8))
            return 0
        if name == "sha256sum":
            code = 0
            for path in args[1:]:
                target = self.phone.host(path, self.cwd)
                if target.is_file():
                    print(f"{hashlib.sha256(target.read_bytes()).hexdigest()}  {path}", file=out)
                else:
                    print(f"sha256sum: {path}: No such file or directory", file=err)
                    code = 1
            return code
        if name == "cat":
            code = 0
            for path in args[1:]:
                if path.startswith(BATTERY) and self.phone.data["battery"].get("sysfs", True):
                    print(self.battery_file(path[len(BATTERY):]), file=out)
                    continue
                try:
                    print(self.phone.host(path, self.cwd).read_text(), end="", file=out)
                except OSError:
                    print(f"cat: {path}: No such file or directory", file=err)
                    code = 1
            return code
        if name == "kill":
            for pid in args[1:]:
                try:
                    os.kill(int(pid), 15)
                except (OSError, ValueError):
                    print(f"kill: {pid}: No such process", file=err)
                    return 1
            return 0
        if name == "dumpsys":
            return self.dumpsys(args[1:], out)
        if name == "/system/bin/time" and self.phone.data.get("toybox_time", True):
            # toybox time -v: the program's resources on stderr (the max RSS measured)
            import resource
            verbose = args[1:2] == ["-v"]
            code = self.command(args[2 if verbose else 1:], env, out, err, background)
            usage = resource.getrusage(resource.RUSAGE_CHILDREN)
            if verbose:
                print(f"Real time (s): 0\nSystem time (s): {usage.ru_stime:g}\nUser time (s): {usage.ru_utime:g}\n"
                      f"Max RSS (KiB): {usage.ru_maxrss}\nMajor faults: {usage.ru_majflt}\n"
                      f"Minor faults: {usage.ru_minflt}", file=err)
            return code
        program = self.phone.host(name, self.cwd) if "/" in name else None
        if program is None or not program.is_file():
            print(f"/system/bin/sh: {name}: inaccessible or not found", file=err)
            return 127
        if not os.access(program, os.X_OK):
            print(f"/system/bin/sh: {name}: can't execute: Permission denied", file=err)
            return 126
        child_env = {**env, "FAKE_PHONE_DIR": str(self.phone.folder), "FAKE_PHONE_CWD": self.cwd,
                     "PYTHONPATH": os.environ.get("PYTHONPATH", ""), "HOME": os.environ.get("HOME", "/tmp")}
        child_env = {k: v for k, v in child_env.items() if v is not None}
        cwd = self.phone.host(self.cwd)
        if background:
            process = subprocess.Popen([str(program), *args[1:]], cwd=cwd, env=child_env, stdout=out, stderr=err,
                                       start_new_session=True)
            self.last_background = str(process.pid)
            return 0
        sys.stdout.flush()
        return subprocess.run([str(program), *args[1:]], cwd=cwd, env=child_env, stdout=out, stderr=err).returncode

    # battery: a constant drain from phone.json, live in /sys; dumpsys battery frozen while unplugged
    def _battery_state(self) -> dict:
        path = self.phone.folder / "battery.json"
        if path.is_file():
            return json.loads(path.read_text())
        state = {"since": time.time(), "unplugged": False, "frozen": None}
        path.write_text(json.dumps(state))
        return state

    def _live(self) -> dict:
        state, battery = self._battery_state(), self.phone.data["battery"]
        charge = int(battery["charge_counter_uah"] - battery["drain_uah_per_s"] * (time.time() - state["since"]))
        return {"charge": charge, "level": int(round(100 * charge / battery["full_uah"])),
                "usb": not state["unplugged"]}

    def battery_file(self, name: str) -> str:
        live = self._live()
        return {"charge_counter": str(live["charge"]), "capacity": str(live["level"]),
                "status": "Charging" if live["usb"] else "Discharging"}.get(name, "")

    def thermalservice(self, out) -> int:
        """Android's `dumpsys thermalservice` (its status line and HAL temperatures), from phone.json's thermal."""
        state = self.phone.data.get("thermal") or {"status": 0, "temperatures": {}}
        lines = ["IsStatusOverride: false", "ThermalEventListeners:", "\tcallbacks: 0", "\tkilled: false",
                 f"Thermal Status: {state['status']}", "Cached temperatures:"]
        temps = [f"\tTemperature{{mValue={c}, mType={t}, mName={n}, mStatus={state['status']}}}"
                 for n, (t, c) in state["temperatures"].items()]
        lines += temps + ["HAL Ready: true", "HAL connection:", "\tThermalHAL 2.0 connected: yes",
                          "Current temperatures from HAL:", *temps, "Current cooling devices from HAL:"]
        print("\n".join(lines), file=out)
        return 0

    def dumpsys(self, args: list[str], out) -> int:
        if args[:1] == ["thermalservice"]:
            return self.thermalservice(out)
        if not args or args[0] != "battery":
            print(f"Can't find service: {args[0] if args else ''}", file=out)
            return 0
        path = self.phone.folder / "battery.json"
        state = self._battery_state()
        if args[1:] == ["unplug"]:
            state.update(unplugged=True, frozen=self._live())
            path.write_text(json.dumps(state))
            return 0
        if args[1:] == ["reset"]:
            state.update(unplugged=False, frozen=None)
            path.write_text(json.dumps(state))
            return 0
        if args[1:]:
            print(f"Unknown option: {args[1]}", file=out)
            return 255
        shown = state["frozen"] or self._live()
        lines = ["Current Battery Service state:"]
        if state["unplugged"]:
            lines.append("  (UPDATES STOPPED -- use 'reset' to restart)")
        lines += ["  AC powered: false", f"  USB powered: {'false' if state['unplugged'] else 'true'}",
                  "  Wireless powered: false", "  Max charging current: 500000", "  Max charging voltage: 5000000",
                  f"  Charge counter: {shown['charge']}", "  status: 2" if not state["unplugged"] else "  status: 3",
                  "  health: 2", "  present: true", f"  level: {shown['level']}", "  scale: 100", "  voltage: 4100",
                  "  temperature: 290", "  technology: Li-ion"]
        print("\n".join(lines), file=out)
        return 0

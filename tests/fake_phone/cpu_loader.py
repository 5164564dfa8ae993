"""Stand-in for glibc's aarch64 loader that the CPU runtime pushes (build_rules/device/cpu_runtime.py), run "on the
phone" by the fake adb's shell as `ld-linux-aarch64.so.1 --library-path DIR PROGRAM ARGS...`.

Like the real loader run explicitly, it refuses to run off the phone, needs every library the runtime's programs
name (cpu_runtime.FILES: libonnxruntime.so.1 and the glibc files) in DIR, and runs PROGRAM in its own process (exec:
the same pid, which power samples in /proc/<pid>/stat). PROGRAM is the tests' x86-64 build of the same
ort_cpu_run.c (make_phone.make_cpu_runtime), linked against the host's real libonnxruntime (ONNX Runtime's CPU
execution provider), so the outputs and the timings file come from the real runner's code; the times are the x86
host's. The phone's paths in the arguments and in the input list are mapped to the phone's folder. Not covered:
whether a phone's kernel and SELinux let the real aarch64 loader run from /data/local/tmp (docs/device.md).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

HOST_LIBRARY_DIR = None  # set by make_cpu_runtime in the generated script: where the host's libonnxruntime.so.1 is
PATH_FLAGS = ("--model", "--input_list", "--output_dir")


def main(argv: list[str]) -> int:
    folder = os.environ.get("FAKE_PHONE_DIR")
    if not folder:
        print("cannot execute binary file: Exec format error (an aarch64 loader: run it on the phone)", file=sys.stderr)
        return 126
    fs, cwd = Path(folder) / "fs", os.environ["FAKE_PHONE_CWD"]

    def host(path: str) -> Path:
        path = path if path.startswith("/") else f"{cwd.rstrip('/')}/{path}"
        return fs / os.path.normpath(path).lstrip("/")
    if len(argv) < 3 or argv[0] != "--library-path":
        print("usage: ld-linux-aarch64.so.1 --library-path DIR PROGRAM [ARGS]", file=sys.stderr)
        return 127
    library_dir, program, args = argv[1], argv[2], list(argv[3:])
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from build_rules.device.cpu_runtime import FILES, LOADER, RUNNER
    for name in FILES:
        if name not in (LOADER, RUNNER) and not host(f"{library_dir}/{name}").is_file():
            print(f"{program}: error while loading shared libraries: {name}: cannot open shared object file: No such "
                  "file or directory", file=sys.stderr)
            return 127
    binary = host(program)
    if not binary.is_file() or not os.access(binary, os.X_OK):
        print(f"{program}: cannot open or execute", file=sys.stderr)
        return 127
    for i, arg in enumerate(args[:-1]):
        if arg in PATH_FLAGS:
            args[i + 1] = str(host(args[i + 1]))
            if arg == "--input_list":  # the phone's paths inside it, too
                listing = Path(args[i + 1])
                mapped = listing.with_name(f".{listing.name}.host-{os.getpid()}")
                mapped.write_text("".join(" ".join(f"{e.partition(':=')[0]}:={host(e.partition(':=')[2])}"
                                                   for e in line.split()) + "\n"
                                          for line in listing.read_text().splitlines() if line.strip()))
                args[i + 1] = str(mapped)
    env = dict(os.environ, LD_LIBRARY_PATH=HOST_LIBRARY_DIR or "")
    os.chdir(host(cwd))
    os.execve(str(binary), [str(binary), *args], env)  # the loader runs the program in its own process
    return 127

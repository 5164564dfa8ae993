"""Push only what the phone lacks: one `sha256sum` over every remote path, then `adb push` of the files whose
digest differs or that are missing (toybox's sha256sum prints '<digest>  <path>' per file it could read): one
`adb push LOCAL... FOLDER` per remote folder (a device check pushed 207 files one `adb push` each before issue 37).
Not `adb push --sync`: it compares mtimes, and the evaluation inputs are written anew for every run."""
from __future__ import annotations

import hashlib
import shlex
from pathlib import Path

from .adb import Adb

EXECUTABLES = ("qnn-net-run", "ort-cpu-run", "ld-linux-aarch64.so.1")  # chmod 755 after a push


def sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def remote_digests(phone: Adb, paths: list[str]) -> dict[str, str]:
    found = {}
    for start in range(0, len(paths), 200):  # the command line stays short
        chunk = paths[start:start + 200]
        _, output = phone.shell_code("sha256sum " + " ".join(shlex.quote(p) for p in chunk) + " 2>/dev/null")
        for line in output.splitlines():
            parts = line.split(None, 1)
            if len(parts) == 2 and len(parts[0]) == 64:
                found[parts[1].strip()] = parts[0]
    return found


def push_missing(phone: Adb, files: dict[str, str | Path]) -> dict:
    """files: remote path -> local file. Returns {"pushed": [...], "kept": [...], "digests": {remote: sha256}}."""
    local = {remote: sha256(path) for remote, path in files.items()}
    there = remote_digests(phone, sorted(files))
    pushed, kept = [], []
    folders = sorted({remote.rsplit("/", 1)[0] for remote in files if there.get(remote) != local[remote]})
    if folders:
        phone.shell("mkdir -p " + " ".join(shlex.quote(f) for f in folders))
    by_folder: dict[str, list[str]] = {}
    for remote in sorted(files):
        if there.get(remote) == local[remote]:
            kept.append(remote)
            continue
        pushed.append(remote)
        if Path(files[remote]).name == remote.rsplit("/", 1)[1]:
            by_folder.setdefault(remote.rsplit("/", 1)[0], []).append(remote)
        else:  # another name on the phone (the CPU baseline's float/<graph>.onnx): a push of its own
            phone.push(files[remote], remote)
    for folder, remotes in by_folder.items():
        if len(remotes) > 1:
            phone.push([files[r] for r in remotes], folder + "/")  # mkdir -p made the folder above
        else:
            phone.push(files[remotes[0]], remotes[0])
    if pushed:
        executables = [r for r in pushed if r.rsplit("/", 1)[1] in EXECUTABLES]
        if executables:
            phone.shell("chmod 755 " + " ".join(shlex.quote(r) for r in executables))
    print(f"{phone.name}: pushed {len(pushed)} file(s), {len(kept)} already there (same sha256)", flush=True)
    return {"pushed": pushed, "kept": kept, "digests": local}

"""The emulator's outputs by content: one binary, one input, one emulator run (across stages and builds).

An entry is keyed by the binary's digest (each ctx model and the .bin files its EPContext nodes point at; a split
graph's parts in order), the input's names, dtypes, shapes and bytes, and the runtime's version (onnxruntime,
onnxruntime-qnn). The emulator is deterministic for one binary and input on one runtime (the proofs of issue 27 rely
on the same fact), so an entry is exactly what a run would give: the reference chip's check and the proofs that read
it, check and evaluate (Whisper's encoder on the same clips), check and dist verify run each pair once.

out/.build-state/emulator-outputs/<2 hex>/<key>.npz, written atomically; an entry that does not load is a miss
(and is removed). The folder is bounded: BUILD_RULES_EMULATOR_MEMO_MB (default 2048; 0 turns the memo off); past
it, the entries used longest ago (mtime, refreshed on each hit) go first.
"""
from __future__ import annotations

import io
import json
import os
from pathlib import Path

from ..build_state.state import EMULATOR_OUTPUTS
from ..plumbing.env_settings import number

ENV = "BUILD_RULES_EMULATOR_MEMO_MB"
DEFAULT_MB = 2048
_PRUNE_TO = 0.8  # of the limit, so pruning is not needed again at the next write
_written_since_prune = 0


def limit_bytes() -> int:
    mb = number(ENV, DEFAULT_MB, least=0, what="the emulator output memo's size in MB >= 0 (0: off)")
    return int(mb * (1 << 20))


def binary_digest(ctx_model) -> str:
    """The digest of what runs: each ctx model's bytes and the bytes of the binaries it points at."""
    import onnx

    from ..build_state.hashing import file_digest, text_digest
    parts = []
    for path in ctx_model if isinstance(ctx_model, (list, tuple)) else [ctx_model]:
        path = Path(path)
        model = onnx.load(str(path), load_external_data=False)
        binaries = []
        for node in model.graph.node:
            if node.op_type != "EPContext":
                continue
            attrs = {a.name: a for a in node.attribute}
            embedded = "embed_mode" in attrs and attrs["embed_mode"].i == 1
            if not embedded and "ep_cache_context" in attrs:
                binaries.append(file_digest(path.parent / attrs["ep_cache_context"].s.decode()))
        parts.append([file_digest(path), binaries])
    return text_digest(json.dumps(parts))


def runtime() -> list:
    from ..plumbing.tool_versions import tool_version
    return [tool_version("onnxruntime"), tool_version("onnxruntime-qnn")]


class Memo:
    """The memo for one binary: get(feed) -> outputs or None, put(feed, outputs)."""

    def __init__(self, ctx_model=None, folder: str | os.PathLike = EMULATOR_OUTPUTS, *, model: bytes | None = None,
                 options: dict | None = None):
        """ctx_model: a compiled binary's ctx model (a split graph's: a list). Or model (ONNX bytes) and options: a
        float or QDQ model the emulator compiles in-process with these options (tune's candidates, diagnose)."""
        import xxhash
        self.folder = Path(folder)
        self.limit = limit_bytes()
        self.enabled = self.limit > 0
        if model is not None:  # (2: blocked int4 weights compiled with the EP's block option, as the build does)
            prefix = json.dumps(["model", xxhash.xxh3_128(model).hexdigest(), options, runtime(), 2],
                                sort_keys=True).encode()
        else:
            prefix = json.dumps([binary_digest(ctx_model), runtime()]).encode()
        self._prefix = prefix if self.enabled else b""
        # What runs, as one name: the key of this binary's record of whether it repeats itself (repeats.py), which
        # decides whether its outputs may be kept here at all.
        self.identity = xxhash.xxh3_128(prefix).hexdigest()

    def key(self, feed: dict) -> str:
        import numpy as np
        import xxhash
        h = xxhash.xxh3_128(self._prefix)
        for name in sorted(feed):
            array = np.ascontiguousarray(feed[name])
            h.update(json.dumps([name, array.dtype.str, list(array.shape)]).encode())
            h.update(array.tobytes())
        return h.hexdigest()

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.npz"

    def get(self, feed: dict) -> dict | None:
        if not self.enabled:
            return None
        import numpy as np
        path = self._path(self.key(feed))
        try:
            with np.load(path, allow_pickle=False) as saved:
                names = [str(n) for n in saved["names"]]
                outputs = {name: saved[f"o{i}"] for i, name in enumerate(names)}
        except FileNotFoundError:
            return None
        except Exception:  # a corrupt or foreign file: a miss, and out of the way
            _remove(path)
            return None
        try:
            os.utime(path)  # used now: pruned last
        except OSError:
            pass
        return outputs

    def put(self, feed: dict, outputs: dict) -> None:
        global _written_since_prune
        if not self.enabled:
            return
        import numpy as np

        buffer = io.BytesIO()
        np.savez(buffer, names=np.array(list(outputs), dtype=str),
                 **{f"o{i}": value for i, value in enumerate(outputs.values())})
        data = buffer.getvalue()
        from ..plumbing.files import atomic_write_bytes
        # no fsync, unlike a build output's: an entry torn by a crash does not load, and is a miss
        atomic_write_bytes(self._path(self.key(feed)), data, fsync=False)
        _written_since_prune += len(data)
        if _written_since_prune == len(data) or _written_since_prune > self.limit // 16:
            prune(self.folder, self.limit)
            _written_since_prune = len(data)


def prune(folder: str | os.PathLike = EMULATOR_OUTPUTS, limit: int | None = None) -> int:
    """Remove the least recently used entries until the folder is within the limit; returns bytes removed."""
    limit = limit_bytes() if limit is None else limit
    entries = []
    for sub in _scandir(Path(folder)):
        for entry in _scandir(Path(sub.path)):
            try:
                st = entry.stat()
            except OSError:
                continue
            entries.append((st.st_mtime, st.st_size, entry.path))
    total = sum(size for _, size, _ in entries)
    if total <= limit:
        return 0
    removed = 0
    for _, size, path in sorted(entries):
        if total - removed <= limit * _PRUNE_TO:
            break
        _remove(Path(path))
        removed += size
    return removed


def _scandir(folder: Path):
    try:
        return [e for e in os.scandir(folder)]
    except OSError:
        return []


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass

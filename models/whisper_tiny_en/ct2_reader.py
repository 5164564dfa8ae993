"""Reader for CTranslate2 ``model.bin`` files (pure numpy, no ctranslate2).

Layout of the file (all integers little-endian), as found in the binary
version 6 files CTranslate2 writes today; versions 4 and 5 are read the same
way (the size and trailing-byte checks catch a layout that differs):

    uint32  binary_version
    string  spec name            (e.g. "WhisperSpec")
    uint32  spec revision
    uint32  number of variables
    repeated per variable:
        string  name             (e.g. "encoder/conv1/weight")
        uint8   rank
        uint32  dims[rank]
        uint8   dtype id
        uint32  byte count
        bytes   raw data         (C order)
    uint32  number of aliases
    repeated per alias:
        string  alias name       (e.g. "decoder/projection/weight")
        string  target variable name

A ``string`` is a uint16 length (including a trailing NUL) followed by that
many bytes. dtype ids: 0 float32, 1 int8, 2 int16, 3 int32, 4 float16,
5 bfloat16 (returned as float32, since numpy has no bfloat16). Scalars
(rank 0) are model constants such as "decoder/num_heads".

Usage::

    from ct2_reader import read_model
    spec = read_model("model.bin")
    spec.name, spec.revision, spec.variables["encoder/conv1/weight"]

``load_variables(path)`` returns just the dict name -> ndarray, with aliases
resolved (an alias maps to the same array object as its target).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

_DTYPES = {
    0: np.dtype("<f4"),
    1: np.dtype("i1"),
    2: np.dtype("<i2"),
    3: np.dtype("<i4"),
    4: np.dtype("<f2"),
    5: np.dtype("<u2"),  # bfloat16 bit pattern, widened to float32 below
}
_BFLOAT16 = 5

SUPPORTED_VERSIONS = range(4, 7)


class CT2FormatError(ValueError):
    """The file is not a CTranslate2 model.bin this reader understands."""


@dataclass
class CT2Model:
    binary_version: int
    name: str
    revision: int
    variables: dict[str, np.ndarray]
    aliases: dict[str, str] = field(default_factory=dict)

    def resolved(self) -> dict[str, np.ndarray]:
        """Variables plus every alias pointing at its target's array."""
        out = dict(self.variables)
        for alias, target in self.aliases.items():
            seen = {alias}
            while target in self.aliases and target not in self.variables:
                if target in seen:
                    raise CT2FormatError(f"alias cycle at {alias!r}")
                seen.add(target)
                target = self.aliases[target]
            if target not in self.variables:
                raise CT2FormatError(f"alias {alias!r} -> unknown variable {target!r}")
            out[alias] = self.variables[target]
        return out


class _Cursor:
    def __init__(self, buf: memoryview, path: str) -> None:
        self.buf = buf
        self.pos = 0
        self.path = path

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise CT2FormatError(
                f"{self.path}: truncated at byte {self.pos} (wanted {n} more, "
                f"file has {len(self.buf)})")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return struct.unpack("<H", self.take(2))[0]

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def string(self) -> str:
        n = self.u16()
        raw = bytes(self.take(n))
        if raw.endswith(b"\0"):
            raw = raw[:-1]
        return raw.decode("utf-8")


def read_model(path: str | Path, *, copy: bool = True) -> CT2Model:
    """Parse a CTranslate2 model.bin.

    With ``copy=False`` the arrays are read-only views into the file bytes
    (one read, no second copy); float16 stays float16 either way.
    """
    path = Path(path)
    data = path.read_bytes()
    cur = _Cursor(memoryview(data), str(path))
    version = cur.u32()
    if version not in SUPPORTED_VERSIONS:
        raise CT2FormatError(f"{path}: unsupported binary version {version} "
                             f"(supported: {SUPPORTED_VERSIONS.start}..{SUPPORTED_VERSIONS.stop - 1})")
    name = cur.string()
    revision = cur.u32()
    count = cur.u32()
    variables: dict[str, np.ndarray] = {}
    for _ in range(count):
        vname = cur.string()
        rank = cur.u8()
        dims = tuple(cur.u32() for _ in range(rank))
        dtype_id = cur.u8()
        if dtype_id not in _DTYPES:
            raise CT2FormatError(f"{path}: variable {vname!r} has unknown dtype id {dtype_id}")
        dtype = _DTYPES[dtype_id]
        nbytes = cur.u32()
        expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
        if nbytes != expected:
            raise CT2FormatError(f"{path}: variable {vname!r} shape {dims} dtype {dtype} "
                                 f"needs {expected} bytes, header says {nbytes}")
        raw = cur.take(nbytes)
        arr = np.frombuffer(raw, dtype=dtype).reshape(dims)
        if dtype_id == _BFLOAT16:
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        elif copy:
            arr = arr.copy()
        if vname in variables:
            raise CT2FormatError(f"{path}: duplicate variable {vname!r}")
        variables[vname] = arr
    aliases: dict[str, str] = {}
    if cur.pos < len(cur.buf):
        for _ in range(cur.u32()):
            alias = cur.string()
            aliases[alias] = cur.string()
    if cur.pos != len(cur.buf):
        raise CT2FormatError(f"{path}: {len(cur.buf) - cur.pos} trailing bytes after the aliases")
    return CT2Model(version, name, revision, variables, aliases)


def load_variables(path: str | Path) -> dict[str, np.ndarray]:
    """name -> ndarray for every variable and alias in ``path``."""
    return read_model(path).resolved()


if __name__ == "__main__":  # pragma: no cover - inspection helper
    import sys

    m = read_model(sys.argv[1], copy=False)
    print(f"version {m.binary_version} spec {m.name!r} revision {m.revision}: "
          f"{len(m.variables)} variables, {len(m.aliases)} aliases")
    for k, v in m.variables.items():
        extra = f" = {v.tolist()}" if v.size <= 4 else ""
        print(f"  {k:60s} {str(v.dtype):8s} {v.shape}{extra}")
    for a, t in m.aliases.items():
        print(f"  alias {a} -> {t}")

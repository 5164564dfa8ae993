"""What a QNN HTP context binary says about itself: the chip and VTCM size it was built for, from the config string
it embeds. Both toolchains' binaries (ort-qnn's and the QAIRT SDK's) are read with it. Standard library only."""
from __future__ import annotations

import re
from pathlib import Path

_CONFIG_MARKER = b"soc_type="
_CONFIG_MAX = 64 * 1024  # the embedded config string is a few KB


def read_binary_target(binary: Path) -> dict:
    """Parse the config string embedded in a QNN HTP context binary.

    Returns {"soc_type": "SM8750", "arch": "79", "vtcm_size": 8388608}. The file is read once, in chunks.
    """
    chunk_size = 1 << 20
    overlap = len(_CONFIG_MARKER) - 1
    buf = b""
    with open(binary, "rb") as f:
        while True:
            chunk = f.read(chunk_size)
            if not chunk:
                break
            buf += chunk
            at = buf.find(_CONFIG_MARKER)
            if at < 0:
                buf = buf[-overlap:]  # keep only what could be the start of a marker split across chunks
                continue
            # Make sure the whole printable config run after the marker is in memory.
            while len(buf) - at < _CONFIG_MAX:
                more = f.read(chunk_size)
                if not more:
                    break
                buf += more
            run = re.match(rb"[\x20-\x7e]*", buf[at:at + _CONFIG_MAX]).group(0).decode("ascii")
            fields: dict[str, str] = {}
            for item in run.split(";"):
                key, sep, value = item.partition("=")
                if sep and key not in fields:
                    fields[key] = value
            if "arch" not in fields:
                raise ValueError(f"{binary}: embedded HTP config has soc_type but no arch: {run[:200]!r}")
            vtcm = fields.get("vtcm_size")
            return {"soc_type": fields["soc_type"], "arch": fields["arch"],
                    "vtcm_size": int(vtcm) if vtcm and vtcm.isdigit() else None}
    raise ValueError(f"{binary} has no embedded HTP config (soc_type=...); not a QNN HTP context binary?")

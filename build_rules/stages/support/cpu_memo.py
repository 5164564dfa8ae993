"""The CPU switch model's measurements kept between tune runs (not a stage): issue 45 item 5, a second tune reuses
the first.

The emulator's measurements are kept by the emulator output memo (one binary, one input). The CPU's were not: a second
`doit tune` after a target edit ran Whisper's CPU ranking again (137 runs, ~2 min) and the CPU search's sets it had
measured already. Here each CPU measurement is one line of out/.build-state/cpu-measurements/<key>.jsonl, where the
key digests what the numbers depend on: the switch model's bytes (the variant's QDQ model with its switches), the
evaluation samples, the hooks and the data (score hooks), the runtime's version and MEMO_VERSION. A line is the set
of tensors at 16 bit (the switches that were on), the samples, the summary and the seconds its run took (what
decisions by pace read: cpu_ranking.costs ranks on one sample when runs are slow, and a remembered run is not). A torn last line (a killed run) is
skipped; nothing else refers to the files (delete the folder to forget them).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ...build_state.state import CPU_MEASUREMENTS

MEMO_VERSION = 2  # a change to how a CPU summary is computed (check.summarize, the switch rule) or kept bumps it


def key(model_bytes: bytes, evaluation: str, hooks: str, data_dir=None) -> str:
    import xxhash

    from ...build_state.hashing import file_digest
    from ..check import hooks_digest
    from importlib.metadata import version
    parts = [MEMO_VERSION, xxhash.xxh3_128_hexdigest(model_bytes), file_digest(evaluation), hooks_digest(hooks),
             version("onnxruntime")]
    if data_dir and Path(data_dir, "data.json").is_file():
        parts.append(file_digest(Path(data_dir, "data.json")))
    return xxhash.xxh3_128_hexdigest(json.dumps(parts).encode())


class CpuMemo:
    """(16-bit switches on, samples) -> summary, read once, appended to as measured."""

    def __init__(self, digest: str, folder: str | os.PathLike = CPU_MEASUREMENTS):
        self.path = Path(folder) / f"{digest}.jsonl"
        self.entries: dict = {}
        try:
            lines = self.path.read_text().splitlines()
        except OSError:
            lines = []
        for line in lines:
            try:
                entry = json.loads(line)
                self.entries[(frozenset(entry["on"]), tuple(entry["samples"]))] = (entry["summary"],
                                                                                    entry.get("seconds", 0.0))
            except (ValueError, KeyError, TypeError):
                continue  # a line a killed run left half written

    def get(self, on: frozenset, samples: tuple):
        """(summary, the seconds its run took) or None."""
        return self.entries.get((on, samples))

    def put(self, on: frozenset, samples: tuple, summary: dict, seconds: float) -> None:
        self.entries[(on, samples)] = (summary, seconds)
        line = json.dumps({"on": sorted(on), "samples": list(samples), "summary": summary,
                           "seconds": round(seconds, 4)}, default=_plain) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:  # one write of one line: concurrent tunes of one graph interleave lines
            f.write(line)


def _plain(value):
    """numpy scalars and arrays as JSON numbers and lists."""
    return value.tolist() if hasattr(value, "tolist") else str(value)

"""tune's measurements kept between tune runs (not a stage): issue 45 item 5, a second tune reuses the first.

Two memos of one format, each measurement one line of out/.build-state/<folder>/<key>.jsonl:
- the CPU switch model's (cpu-measurements/, cpu_key): a second `doit tune` after a target edit ran Whisper's CPU
  ranking again (137 runs, ~2 min) and the CPU search's sets it had measured already;
- the emulator's, per candidate (emulator-measurements/, emulator_key): the emulator output memo kept each sample's
  outputs, but every candidate was quantized again to find its key (5-10 s each on Whisper), and a remembered
  measurement took no time, so the time budgets (mixed_precision._Budget) let a second tune go further than the
  first and measure sets it never had.
The key digests what the numbers depend on: the model's bytes (the switch model; for the emulator the variant's
all-8-bit QDQ model, from which every candidate is quantized), the evaluation samples, the hooks and the data (score
hooks), the runtimes' versions, MEMO_VERSION (and for the emulator the chip, the quantize stage's version and the
check's measurement version). A line: the set of tensors at 16 bit, the samples, how many of them ran twice (the
emulator's; a request for more checks is not answered by fewer), the summary (a partial one answers only targets it
still decides: precision.answers) and the seconds the run took (what decisions by pace read: the CPU ranking's sample
count, the search's time budgets). A torn last line (a killed run) is skipped; nothing else refers to the files
(delete the folder to forget them).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ...build_state.state import CPU_MEASUREMENTS, EMULATOR_MEASUREMENTS

MEMO_VERSION = 2  # a change to how a summary is computed (check.summarize, the switch rule) or kept bumps it


def cpu_key(model_bytes: bytes, evaluation: str, hooks: str, data_dir=None) -> str:
    from importlib.metadata import version
    return _digest([MEMO_VERSION, _bytes(model_bytes), *_inputs(evaluation, hooks, data_dir), version("onnxruntime")])


def emulator_key(base_bytes: bytes, evaluation: str, hooks: str, data_dir, chip: dict) -> str:
    from ...emulator.emulator_memo import runtime
    from ...stage_table import worker
    from ..check import MEASUREMENT_VERSION
    return _digest([MEMO_VERSION, _bytes(base_bytes), *_inputs(evaluation, hooks, data_dir), runtime(),
                    chip["soc_id"], chip["vtcm_mb"], worker("quantize", "ort-qnn").version, MEASUREMENT_VERSION])


class TuneMemo:
    """(16-bit set, samples) -> (summary, seconds), read once, appended to as measured."""

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
                self.entries[(frozenset(entry["on"]), tuple(entry["samples"]))] = (
                    entry["summary"], entry.get("seconds", 0.0), entry.get("twice", 0))
            except (ValueError, KeyError, TypeError):
                continue  # a line a killed run left half written

    def get(self, on: frozenset, samples: tuple, twice: int = 0):
        """(summary, the seconds its run took) or None; an entry whose run checked fewer than `twice` samples twice
        does not answer."""
        found = self.entries.get((on, samples))
        return None if found is None or found[2] < twice else found[:2]

    def put(self, on: frozenset, samples: tuple, summary: dict, seconds: float, twice: int = 0) -> None:
        self.entries[(on, samples)] = (summary, seconds, twice)
        line = json.dumps({"on": sorted(on), "samples": list(samples), "summary": summary,
                           "seconds": round(seconds, 4), **({"twice": twice} if twice else {})},
                          default=_plain) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a+b") as f:  # one write of one line: concurrent tunes of one graph interleave lines
            if f.tell():  # after a torn last line (a killed run), this line starts on a line of its own
                f.seek(-1, os.SEEK_END)
                line = line if f.read(1) == b"\n" else "\n" + line
            f.write(line.encode())


def emulator_memo(digest: str) -> TuneMemo:
    return TuneMemo(digest, EMULATOR_MEASUREMENTS)


def _inputs(evaluation: str, hooks: str, data_dir) -> list:
    from ...build_state.hashing import file_digest
    from ..check import hooks_digest
    parts = [file_digest(evaluation), hooks_digest(hooks)]
    if data_dir and Path(data_dir, "data.json").is_file():
        parts.append(file_digest(Path(data_dir, "data.json")))
    return parts


def _bytes(data: bytes) -> str:
    import xxhash
    return xxhash.xxh3_128_hexdigest(data)


def _digest(parts: list) -> str:
    import xxhash
    return xxhash.xxh3_128_hexdigest(json.dumps(parts).encode())


def _plain(value):
    """numpy scalars and arrays as JSON numbers and lists."""
    return value.tolist() if hasattr(value, "tolist") else str(value)

"""Whether a binary repeats itself: the same binary and input, run again in the same emulator session, give the same
bytes. Every verdict of the build rests on it (the output memo keeps one run as the answer, a chip's proof compares
bytes, a gate judges one run), and it does not always hold: some 16-bit binaries on the x86 HTP emulator give other
outputs on each run (measured on YOLOv8n w8a16: 1 run in 3 differs, by up to 200 in a 0..320 output; fp16 and w8a8
binaries of the same model, and every MTCNN binary, repeat themselves; docs/building.md, "A binary that does not
repeat itself").

So the emulator door (emulator_runs.py) runs each of a binary's first samples twice and compares the bytes, and keeps
what it found per binary in a record (out/.build-state/emulator-repeats/): how many samples repeated themselves, or
the first that did not. A binary that did not is never memoized again and each of its samples runs twice from then
on, so whoever measures it sees the spread; one with enough equal samples runs each sample once.

A leaf module: records, the outputs of one sample over its runs, and what a set of them shows.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..build_state.state import EMULATOR_REPEATS
from ..plumbing.env_settings import number

SAMPLES_ENV = "BUILD_RULES_REPEAT_SAMPLES"
# Samples run twice per binary before it is taken to repeat itself. On YOLOv8n w8a16 two runs of one sample differ
# with probability ~1/3, so 16 equal pairs happen by chance with probability ~0.2 %; a tuning candidate, measured on
# a subset and judged again as built, uses fewer (CANDIDATE_SAMPLES).
DEFAULT_SAMPLES = 16
CANDIDATE_SAMPLES = 2


def samples_to_check() -> int:
    """How many samples of each binary run twice (BUILD_RULES_REPEAT_SAMPLES; 0: none, each sample runs once and
    the reports say that repeatability was not checked)."""
    return number(SAMPLES_ENV, DEFAULT_SAMPLES, whole=True, least=0,
                  what="a whole number >= 0 of samples each binary runs twice to check that it repeats itself "
                       "(0: none)")


class Outputs(dict):
    """One sample's outputs ({name: array}, the first run's), with the other runs of the same session in `others`
    (empty when the sample ran once). Pickles with its runs (worker pipes, Ray)."""

    def __init__(self, outputs: dict | None = None, others: list[dict] | None = None):
        super().__init__(outputs or {})
        self.others = list(others or [])

    def __reduce__(self):
        return (Outputs, (dict(self), self.others))

    def spread(self) -> dict[str, float]:
        """Output name -> the largest difference between this run and any other of the same sample (0.0: equal
        bytes). Empty when the sample ran once."""
        found: dict[str, float] = {}
        for other in self.others:
            for name, value in self.items():
                found[name] = max(found.get(name, 0.0), difference(value, other.get(name)))
        return found

    def repeats(self) -> bool | None:
        """True when every run gave the same bytes, False when one did not, None when the sample ran once."""
        if not self.others:
            return None
        return all(v == 0.0 for v in self.spread().values())

    def run(self, index: int) -> dict:
        """The outputs of run `index` (0: the first); a sample that ran fewer times gives its last run's."""
        if index == 0 or not self.others:
            return dict(self)
        return dict(self.others[min(index, len(self.others)) - 1])

    def only(self, names) -> "Outputs":
        """These outputs of every run (a QDQ model's extra outputs left out)."""
        return Outputs({n: self[n] for n in names}, [{n: o[n] for n in names} for o in self.others])


def difference(a, b) -> float:
    """0.0 for the same dtype, shape and bytes; else the largest absolute difference (inf when not comparable)."""
    import numpy as np
    if b is None or a.dtype != b.dtype or a.shape != b.shape:
        return float("inf")
    if a.tobytes() == b.tobytes():
        return 0.0
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


def shown(outputs: list) -> dict | None:
    """What a job's samples (Outputs, in sample order) show about repeating: None when none ran twice, else
    {"repeats": bool, "samples": samples run twice, "runs": runs of each, "spread": {output: largest difference},
    "varying_samples": how many differed, "first": {"sample", "output", "spread"} of the first that differed}."""
    repeated = [(i, o) for i, o in enumerate(outputs) if isinstance(o, Outputs) and o.others]
    if not repeated:
        return None
    spread: dict[str, float] = {}
    first, varying = None, 0
    for index, sample in repeated:
        per_output = sample.spread()
        for name, value in per_output.items():
            spread[name] = max(spread.get(name, 0.0), value)
        worst = max(per_output.items(), key=lambda kv: kv[1], default=(None, 0.0))
        if worst[1] > 0:
            varying += 1
            if first is None:
                first = {"sample": index, "output": worst[0], "spread": worst[1]}
    return {"repeats": first is None, "samples": len(repeated), "runs": 1 + max(len(o.others) for _, o in repeated),
            "spread": spread, "varying_samples": varying, "first": first}


def describe(found: dict) -> str:
    """'sample 0's output 'output0' differed between 2 runs of one session by up to 61.3 (4 of 6 samples differed)'."""
    first = found["first"]
    return (f"sample {first['sample']}'s output {first['output']!r} differed between {found['runs']} runs of one "
            f"session by up to {first['spread']:.4g} ({found['varying_samples']} of {found['samples']} samples run "
            f"{found['runs']} times differed; largest difference {max(found['spread'].values()):.4g})")


class Record:
    """What is known of one binary (by its memo identity: the binary's bytes, or a model's and its compile options,
    and the runtime): {"equal": samples that ran twice with equal bytes, "unstable": the first difference or None}.
    One small JSON file; written atomically, read at each sample (another stage or worker may have found more)."""

    def __init__(self, identity: str, folder: str | os.PathLike = EMULATOR_REPEATS):
        self.path = Path(folder) / identity[:2] / f"{identity}.json"

    def load(self) -> dict:
        try:
            found = json.loads(self.path.read_text())
            if isinstance(found, dict) and isinstance(found.get("equal"), int):
                return found
        except (OSError, ValueError):
            pass
        return {"equal": 0, "unstable": None}

    def checked(self, wanted: int) -> bool:
        """Whether enough samples repeated themselves that a sample may run once (and be memoized)."""
        found = self.load()
        return found["unstable"] is None and found["equal"] >= wanted

    def unstable(self) -> dict | None:
        return self.load()["unstable"]

    def note(self, sample: Outputs) -> bool:
        """Adds a sample that ran more than once; returns whether it repeated itself. Read and written under a lock:
        a job's workers note their samples at once (two read "equal": 0 and both wrote 1; a worker could write back
        "unstable": None over another's finding)."""
        spread = sample.spread()
        worst = max(spread.items(), key=lambda kv: kv[1], default=(None, 0.0))
        from ..plumbing.files import exclusive_lock
        # the lock file beside the record (the record itself is replaced on each write, so it cannot hold one)
        with exclusive_lock(self.path.with_suffix(".lock")):
            found = self.load()
            if worst[1] > 0:
                if found["unstable"] is None:
                    found["unstable"] = {"output": worst[0], "spread": worst[1], "runs": 1 + len(sample.others)}
                    self._write(found)
                return False
            if found["unstable"] is None:
                found["equal"] += 1
                self._write(found)
            return True

    def _write(self, found: dict) -> None:
        from ..plumbing.files import atomic_write_bytes
        atomic_write_bytes(self.path, json.dumps(found, sort_keys=True).encode(), fsync=False)

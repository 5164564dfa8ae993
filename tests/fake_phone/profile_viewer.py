"""Stand-in for bin/x86_64-linux-clang/qnn-profile-viewer: --input_log (required, comma-separated), --output
<file.csv>, --reader, --schematic, --config (accepted). The stand-in cannot parse QNN's binary log; the stand-in
qnn-net-run filed the CSV QNN itself wrote with that log (through ONNX Runtime's QNN EP, rows 'Msg Timestamp,Message,
Time,Unit of Measurement,Timing Source,Event Level,Event Identifier') under the log's sha256 in the phone's folder:
--output gets that CSV. Whether a real viewer's CSV has the same rows for a qnn-net-run log is not verified."""
from __future__ import annotations

import argparse
import csv
import hashlib
import os
import shutil
import statistics
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="qnn-profile-viewer", allow_abbrev=False)
    p.add_argument("--input_log", required=True)
    p.add_argument("--output")
    p.add_argument("--reader")
    p.add_argument("--schematic")
    p.add_argument("--config")
    args = p.parse_args(argv)
    logs = [Path(x) for x in args.input_log.split(",")]
    for log in logs:
        if not log.is_file():
            print(f"ERROR: Could not open input log: {log}", file=sys.stderr)
            return 1
    digest = hashlib.sha256(logs[0].read_bytes()).hexdigest()
    found = list(Path(os.environ.get("FAKE_ADB_PHONES", "/nonexistent")).glob(f"*/profiles/{digest}.csv"))
    if not found:
        print(f"ERROR: stand-in qnn-profile-viewer: no CSV recorded for {logs[0]} (not written by the stand-in "
              "qnn-net-run)", file=sys.stderr)
        return 1
    if args.output:
        shutil.copyfile(found[0], args.output)
    with open(found[0], newline="") as f:
        rows = list(csv.DictReader(f))
    runs = [float(r["Time"]) for r in rows if r["Event Identifier"] == "QNN (execute) time"]
    load = [float(r["Time"]) for r in rows if r["Event Identifier"] == "QNN (load binary) time"]
    print(f"Input Log File Location: {logs[0]}\n\nInit Stats:\n-----------\n    Backend (QNN (load binary) time): "
          f"{load[0] if load else 0:.0f} us\n\nExecute Stats (Average):\n------------------------\n"
          f"    Backend (QNN (execute) time): {statistics.mean(runs) if runs else 0:.0f} us")
    return 0

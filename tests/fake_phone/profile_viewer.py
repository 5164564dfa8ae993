"""Stand-in for bin/x86_64-linux-clang/qnn-profile-viewer: --input_log (required), --output <file.csv>, --reader,
--schematic, --config (accepted). Reads the stand-in net-run's log and writes the CSV layout of QNN profiling CSVs
(header 'Msg Timestamp,Message,Time,Unit of Measurement,Timing Source,Event Level,Event Identifier'; ONNX Runtime's
QNN EP writes the same columns), one row per event; prints an Init/Execute summary. Not checked against a real one."""
from __future__ import annotations

import argparse
import csv
import json
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
    lines = logs[0].read_text().splitlines()
    head, events = json.loads(lines[0]), [json.loads(x) for x in lines[1:]]
    if args.output:
        with open(args.output, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["Msg Timestamp", "Message", "Time", "Unit of Measurement", "Timing Source", "Event Level",
                        "Event Identifier"])
            for stamp, event in enumerate(events):
                w.writerow([stamp, event["event"], round(event["us"]), "US", "NETRUN", "ROOT", head["graph"]])
    runs = [e["us"] for e in events if e["event"] == "Execute"]
    init = next(e["us"] for e in events if e["event"] == "Init")
    print(f"Input Log File Location: {logs[0]}\n\nInit Stats:\n-----------\n    NetRun: {init:.0f} us\n\n"
          f"Execute Stats (Average):\n------------------------\nTotal Inference Time:\n---------------------\n"
          f"Graph 0 ({head['graph']}):\n    NetRun: {statistics.mean(runs):.0f} us")
    return 0

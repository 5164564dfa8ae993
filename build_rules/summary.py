"""doit's console output plus a short summary at the end: what ran, what was built, what was skipped."""
from __future__ import annotations

import json
from pathlib import Path

from doit.reporter import ConsoleReporter


class SummaryReporter(ConsoleReporter):
    desc = "console output with a build summary"

    def __init__(self, outstream, options):
        super().__init__(outstream, options)
        self.ran: list = []
        self.up_to_date = 0
        from .runner import CACHE_HITS
        self.hits_before = len(CACHE_HITS)  # tests run several builds in one process

    def add_success(self, task):
        if task.actions:
            self.ran.append(task)

    def skip_uptodate(self, task):
        super().skip_uptodate(task)
        if task.actions:
            self.up_to_date += 1

    def complete_run(self):
        # Failures were written when they happened (add_failure); the stage's own output is in its log,
        # so doit's empty "<stderr>/<stdout>" blocks are left out.
        if self.runtime_errors:
            self.write("Execution aborted.\n" + "\n".join(self.runtime_errors) + "\n")
        failed = len(self.failures)
        from .runner import CACHE_HITS
        restored = len(CACHE_HITS) - self.hits_before
        self.write(f"summary: {len(self.ran)} task(s) ran"
                   + (f" ({restored} restored from the build cache)" if restored else "")
                   + f", {self.up_to_date} up to date" + (f", {failed} failed" if failed else "") + "\n")
        for task in self.ran:
            if task.name.startswith("package:"):
                self.write(f"  built {_describe(task.targets[0])}\n")
        from .tasks import skipped_builds
        for note in skipped_builds():
            self.write(f"  note: {note}\n")


def _describe(manifest_path: str) -> str:
    try:
        manifest = json.loads(Path(manifest_path).read_text())
    except (OSError, ValueError):
        return manifest_path
    parts = []
    for graph, info in manifest["graphs"].items():
        gate = info.get("gate")
        gate_text = ""
        if info.get("check") == "not run":  # qairt without qnn-net-run: no metric was measured
            gate_text = " (check not run)"
        elif gate:
            metric = gate["metric"]
            gate_text = f" {metric} {info['metrics'].get(metric, float('nan')):.4g}"
        parts.append(f"{graph} {info['bytes'] / 1e6:.2f} MB{gate_text}")
    evaluation = manifest.get("evaluate")
    if evaluation and evaluation.get("gate"):  # the model-level metric, e.g. WER of encoder + decoder
        metric = evaluation["gate"]["metric"]
        parts.append(f"model {metric} {evaluation['metrics'].get(metric, float('nan')):.4g}")
    return f"{Path(manifest_path).parent}: " + ", ".join(parts)

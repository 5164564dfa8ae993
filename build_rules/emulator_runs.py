"""Runs a compiled binary over samples on the x86 HTP emulator: the one door every stage's emulator work goes through.

A stage gives a context model (<graph>_ctx.onnx, or a split graph's parts in order) and its input samples, and gets
each sample's outputs back in sample order. The caller may stop early (an early verdict): closing the iterator of
iter_outputs() stops the samples not yet run.

(Serial for now: the worker pool, the machine-wide limit and the output memo of issue 36 land behind this interface.)
"""
from __future__ import annotations

from collections.abc import Iterator


def iter_outputs(ctx_model, inputs: list[dict], what: str = "samples") -> Iterator[tuple[int, dict]]:
    """(index, {output name: array}) for each input sample, in sample order; closing it stops the rest."""
    from . import emulator_ray, progress
    if emulator_ray.configured():  # a Ray cluster is named: the samples run there (docs/ray.md)
        yield from emulator_ray.iter_outputs(ctx_model, inputs, what, _open)
        return
    run = _open(ctx_model)
    for index, feed in enumerate(progress.track(inputs, what)):
        yield index, run(feed)


def run_outputs(ctx_model, inputs: list[dict], what: str = "samples") -> list[dict]:
    """Every sample's outputs, in sample order."""
    return [outputs for _, outputs in iter_outputs(ctx_model, inputs, what)]


def _open(ctx_model):
    if isinstance(ctx_model, (list, tuple)):  # a split graph: its parts' binaries, in order (chain.py)
        from . import chain
        return chain.open_on_emulator(list(ctx_model))
    from .toolchains import ort_qnn
    return ort_qnn.open_context_binary(ctx_model)

"""Runs a compiled binary over samples on the x86 HTP emulator: the one door every stage's emulator work goes through.

A stage gives a context model (<graph>_ctx.onnx, or a split graph's parts in order) and its input samples, and gets
each sample's outputs back in sample order. Behind the door:
- the output memo (emulator_memo.py): a sample this binary already ran on, in any stage, is not run again;
- the samples left are spread over worker processes, one emulator session each, at most BUILD_RULES_EMULATOR_WORKERS
  sessions on the machine at once (emulator_pool.py, emulator_slots.py); one sample left, or a limit of 1, runs in
  this process. The outputs are the same bytes whichever way they ran.
- the caller may stop early (an early verdict): closing the iterator of iter_outputs() stops the samples not yet run
  and ends the workers.
Work that is not "this binary on these feeds" (an evaluate hook scoring one sample with several graphs, diagnose's
per-tensor session) goes through iter_results(): a job named by an opener function that each worker calls once.
"""
from __future__ import annotations

from collections.abc import Iterator

from . import emulator_slots

_BINARY = "build_rules.emulator_runs:open_binary"


def worker_count() -> int:
    """How many emulator sessions run at once (machine-wide): a job of n samples uses min(n, this) workers. A time-left
    estimate divides the emulator work left by it."""
    return emulator_slots.limit()


def iter_outputs(ctx_model, inputs: list[dict], what: str = "samples") -> Iterator[tuple[int, dict]]:
    """(index, {output name: array}) for each input sample, in sample order; closing it stops the rest. The samples
    the output memo lacks run on this machine's workers, or on a Ray cluster when one is named (docs/ray.md: only
    these jobs travel, a binary's files with them)."""
    from . import emulator_memo, emulator_ray
    if not emulator_ray.configured():
        yield from _through_memo(emulator_memo.Memo(ctx_model),
                                 lambda items, counter: iter_results(_BINARY, (ctx_model,), items, what, counter),
                                 inputs, what)
        return
    emulator_ray.preflight()  # ray missing or the cluster not answering: fails here, before the memo reads
    memo = emulator_memo.Memo(ctx_model)

    def on_ray(items: list[dict], counter) -> Iterator[tuple[int, dict]]:
        counter.where = "the Ray cluster"
        for index, outputs in emulator_ray.iter_outputs(ctx_model, items, what, _open):
            memo.put(items[index], outputs)  # (workers put their own; Ray's come back here)
            counter.done += 1
            yield index, outputs
    yield from _through_memo(memo, on_ray, inputs, what)


def _through_memo(memo, run_missing, inputs: list[dict], what: str) -> Iterator[tuple[int, dict]]:
    """(index, outputs) in sample order: the memo's where it has them, the rest from run_missing(items, counter)."""
    from . import progress
    remembered = {}
    for index, feed in enumerate(inputs):
        outputs = memo.get(feed)
        if outputs is not None:
            remembered[index] = outputs
    missing = [i for i in range(len(inputs)) if i not in remembered]
    if remembered and missing:
        print(f"{len(remembered)} of {len(inputs)} {what} from the emulator output memo", flush=True)
    elif remembered:
        print(f"all {len(inputs)} {what} from the emulator output memo: the emulator does not run", flush=True)
    with progress.counting(what, len(inputs)) as counter:
        counter.done = len(remembered)
        runs = run_missing([inputs[i] for i in missing], counter)
        try:
            for index in range(len(inputs)):
                yield index, remembered.pop(index) if index in remembered else next(runs)[1]
        finally:
            runs.close()


def run_outputs(ctx_model, inputs: list[dict], what: str = "samples") -> list[dict]:
    """Every sample's outputs, in sample order."""
    return [outputs for _, outputs in iter_outputs(ctx_model, inputs, what)]


def iter_results(opener: str, args: tuple, items: list, what: str = "samples",
                 counter=None) -> Iterator[tuple[int, object]]:
    """(index, apply(item)) for each item in order, where apply = opener(*args) is called once per worker.
    opener: "package.module:function", importable in a fresh interpreter; args and items picklable.
    counter: a progress counter whose .done counts items as they complete on any worker.
    These jobs run on this machine's workers even when a Ray cluster is named: their args name local files (an
    evaluate hook's graphs) or carry a model compiled in-process; only iter_outputs' binaries travel (docs/ray.md)."""
    if not items:
        return
    workers = min(worker_count(), len(items))
    if workers <= 1 or emulator_slots.held() is not None:  # (a worker, or a job inside a job: this one's slot)
        yield from _in_process(opener, args, items, counter)
    else:
        from . import emulator_pool
        yield from emulator_pool.run(opener, args, items, workers, what, counter)


def _in_process(opener: str, args: tuple, items: list, counter) -> Iterator[tuple[int, object]]:
    from .emulator_pool import resolve
    with holding_slot():
        apply = resolve(opener)(*args)
        for index, item in enumerate(items):
            result = apply(item)
            if counter is not None:
                counter.done += 1
            yield index, result


def holding_slot():
    """For emulator work this process does itself, outside iter_results (an old-form evaluate hook): one of the
    machine's slots, held for the block."""
    return emulator_slots.slot(waiting=_say_waiting)


def _say_waiting(n: int) -> None:
    print(f"waiting for an emulator slot: {n} session(s) run at once on this machine "
          f"({emulator_slots.ENV}={n}; see docs/building.md)", flush=True)


def open_binary(ctx_model, eager: bool = False):
    """feed -> outputs for one binary (a split graph: its parts in order), through the output memo: the session is
    opened at the first feed the memo does not have (eager: now, so a binary the emulator cannot load fails here)."""
    from . import emulator_memo
    memo = emulator_memo.Memo(ctx_model)
    session = _open(ctx_model) if eager else None

    def run(feed: dict) -> dict:
        nonlocal session
        outputs = memo.get(feed)
        if outputs is None:
            if session is None:
                session = _open(ctx_model)
            outputs = session(feed)
            memo.put(feed, outputs)
        return outputs

    return run


class EmulatorCompileError(RuntimeError):
    """The emulator could not compile a model in-process (run_model_outputs)."""


def iter_model_outputs(model, inputs: list[dict], *, soc_model: int, vtcm_mb: int, fp16: bool = False,
                       what: str = "emulator samples") -> Iterator[tuple[int, dict]]:
    """A float or QDQ model (a path or ONNX bytes) compiled in-process for one SoC, as tune's candidates and diagnose
    run it (ort_qnn.emulator_session: no context binary written): (index, outputs) over the inputs in order, each
    worker compiling it once; closing it stops the rest (an early verdict). Through the output memo, keyed by the
    model's bytes and the compile options. Raises EmulatorCompileError when it does not compile."""
    from pathlib import Path

    from . import emulator_memo
    data = model if isinstance(model, bytes) else Path(model).read_bytes()
    options = {"soc_model": soc_model, "vtcm_mb": vtcm_mb, "fp16": fp16}
    yield from _through_memo(emulator_memo.Memo(model=data, options=options),
                             lambda items, counter: iter_results("build_rules.emulator_runs:open_model", (data, options),
                                                                 items, what, counter), inputs, what)


def run_model_outputs(model, inputs: list[dict], **options) -> list[dict]:
    """iter_model_outputs' outputs of every sample, in order."""
    return [outputs for _, outputs in iter_model_outputs(model, inputs, **options)]


def open_model(data: bytes, options: dict):
    """feed -> outputs of a model compiled in-process now (run_model_outputs' workers), through the output memo."""
    from . import emulator_memo
    from .toolchains import ort_qnn
    try:
        session = ort_qnn.emulator_session(data, **options)
    except Exception as e:  # onnxruntime raises its own exception types
        raise EmulatorCompileError(f"{type(e).__name__}: {str(e).strip()[:600]}") from None
    names = [o.name for o in session.get_outputs()]
    memo = emulator_memo.Memo(model=data, options=options)

    def run(feed: dict) -> dict:
        outputs = memo.get(feed)
        if outputs is None:
            outputs = dict(zip(names, session.run(names, feed)))
            memo.put(feed, outputs)
        return outputs

    return run


def _open(ctx_model):
    if isinstance(ctx_model, (list, tuple)):  # a split graph: its parts' binaries, in order (chain.py)
        from . import chain
        return chain.open_on_emulator(list(ctx_model))
    from .toolchains import ort_qnn
    return ort_qnn.open_context_binary(ctx_model)

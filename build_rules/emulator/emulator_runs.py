"""Runs a compiled binary over samples on the x86 HTP emulator: the one door every stage's emulator work goes through.

A stage gives a context model (<graph>_ctx.onnx, or a split graph's parts in order) and its input samples, and gets
each sample's outputs back in sample order. Behind the door:
- whether the binary repeats itself (repeats.py): its first samples run twice in one session and the bytes are
  compared; one that differs is recorded, and that binary's samples run twice from then on, never from the memo;
- the output memo (emulator_memo.py): a sample this binary already ran on, in any stage, is not run again (when the
  binary repeats itself);
- the samples left run in this process first: while they look small (the rest would take less than
  BUILD_RULES_EMULATOR_INLINE_SECONDS here), all of them, since two workers cost more than they save on a small job;
  else the rest are spread over worker processes, one emulator session each, at most BUILD_RULES_EMULATOR_WORKERS
  sessions on the machine at once (emulator_pool.py, emulator_slots.py). A limit of 1 runs everything here. The
  outputs are the same bytes whichever way they ran.
- the caller may stop early (an early verdict): closing the iterator of iter_outputs() stops the samples not yet run
  and ends the workers.
Work that is not "this binary on these feeds" (an evaluate hook scoring one sample with several graphs, diagnose's
per-tensor session) goes through iter_results(): a job named by an opener function that each worker calls once.
"""
from __future__ import annotations

import math
import time
from collections.abc import Iterator

from . import emulator_slots
from ..plumbing.env_settings import number

_BINARY = "build_rules.emulator.emulator_runs:open_binary"
INLINE_ENV = "BUILD_RULES_EMULATOR_INLINE_SECONDS"
# A job whose samples left would take less than this in this process runs them all here. Two workers each start,
# open the binary (or compile the model) and hold a core: for the tiny net's check (8 samples run, ~2 ms each) that
# was most of the stage's CPU (MTCNN from scratch: 117 -> 103 s of CPU, docs/benchmarks.md). At 1 s, a job kept
# here takes at most ~0.5 s longer than on two idle cores.
INLINE_SECONDS = 1.0
_now = time.perf_counter  # (a test replaces it to decide the probe)


def inline_seconds() -> float:
    """BUILD_RULES_EMULATOR_INLINE_SECONDS: how long a job's samples left may take in this process before they go to
    workers instead; 0: every job of two or more samples goes to workers (as before the probe)."""
    return number(INLINE_ENV, INLINE_SECONDS, least=0, what="a number of seconds >= 0")


def worker_count() -> int:
    """How many emulator sessions run at once (machine-wide): a job of n samples uses min(n, this) workers. A time-left
    estimate divides the emulator work left by it."""
    return emulator_slots.limit()


def iter_outputs(ctx_model, inputs: list[dict], what: str = "samples",
                 repeat_samples: int | None = None) -> Iterator[tuple[int, dict]]:
    """(index, outputs) for each input sample, in sample order; closing it stops the rest. The samples the output
    memo lacks run on this machine's workers, or on a Ray cluster when one is named (docs/ray.md: only these jobs
    travel, a binary's files with them). Until `repeat_samples` of the binary's samples (default: repeats.py's
    BUILD_RULES_REPEAT_SAMPLES) ran twice with equal bytes, each runs twice; the outputs are repeats.Outputs, whose
    `others` hold the second run (see repeats.shown())."""
    from . import emulator_memo, emulator_ray, repeats
    wanted = repeats.samples_to_check() if repeat_samples is None else repeat_samples
    if emulator_ray.configured():
        emulator_ray.preflight()  # ray missing or the cluster not answering: fails here, before the memo reads
    memo = emulator_memo.Memo(ctx_model)
    record = repeats.Record(memo.identity)
    if not emulator_ray.configured():
        yield from _through_memo(memo, record,
                                 lambda items, counter: iter_results(_BINARY, (ctx_model, False, wanted), items, what,
                                                                     counter),
                                 inputs, what, wanted)
        return

    def on_ray(items: list[dict], counter) -> Iterator[tuple[int, dict]]:
        counter.where = "the Ray cluster"
        items = [_plain(feed)[0] for feed in items]  # Ray's openers decide per job (_open_twice)
        opener = _open if record.checked(wanted) else _open_twice
        for index, outputs in emulator_ray.iter_outputs(ctx_model, items, what, opener):
            outputs = outputs if isinstance(outputs, repeats.Outputs) else repeats.Outputs(outputs)
            _keep(memo, record, items[index], outputs)  # (workers keep their own; Ray's come back here)
            counter.done += 1
            yield index, outputs
    yield from _through_memo(memo, record, on_ray, inputs, what, wanted)


def _through_memo(memo, record, run_missing, inputs: list[dict], what: str,
                  wanted: int) -> Iterator[tuple[int, dict]]:
    """(index, outputs) in sample order: the memo's where it has them, the rest from run_missing(items, counter).
    A binary that did not repeat itself takes nothing from the memo: every sample runs (twice)."""
    from . import repeats
    from ..plumbing import progress
    remembered = {}
    unstable = record.unstable()
    if unstable is None:
        for index, feed in enumerate(inputs):
            outputs = memo.get(feed)
            if outputs is not None:
                remembered[index] = repeats.Outputs(outputs)
    else:
        print(f"{what}: this binary did not repeat itself on the emulator (output {unstable['output']!r} differed "
              f"by up to {unstable['spread']:.4g} between {unstable['runs']} runs of one sample): each sample runs "
              "twice and none comes from the output memo", flush=True)
    missing = [i for i in range(len(inputs)) if i not in remembered]
    # Which samples run twice is decided here, for the whole job: the first of those missing, as many as the binary
    # still needs (all when it did not repeat itself). Left to each worker's look at the shared record, two workers
    # raced and a check reported 16 or 17 samples run twice for the same binary.
    found = record.load()
    need = len(missing) if found["unstable"] is not None else max(0, wanted - found["equal"])
    if remembered and missing:
        print(f"{len(remembered)} of {len(inputs)} {what} from the emulator output memo", flush=True)
    elif remembered:
        print(f"all {len(inputs)} {what} from the emulator output memo: the emulator does not run", flush=True)
    with progress.counting(what, len(inputs)) as counter:
        counter.done = len(remembered)
        runs = run_missing([{**inputs[i], TWICE: k < need} for k, i in enumerate(missing)], counter)
        checked = []  # samples that ran twice and repeated: memoized at the end, if no sample of the job differed
        try:
            for index in range(len(inputs)):
                if index in remembered:
                    yield index, remembered.pop(index)
                    continue
                outputs = next(runs)[1]
                if getattr(outputs, "others", None):
                    checked.append((inputs[index], outputs))
                yield index, outputs
        finally:
            runs.close()
            # (a worker memoizes no sample that ran twice: sample 0 could repeat and be kept before sample 1 showed
            # that the binary does not repeat itself, one draw in the memo after all)
            if record.unstable() is None:
                for feed, outputs in checked:
                    if max(outputs.spread().values(), default=0.0) == 0:
                        memo.put(feed, dict(outputs))


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
    # all here: one item, a limit of 1, or a job inside a job (a worker's: its slot); else here while it looks small
    alone = min(worker_count(), len(items)) <= 1 or emulator_slots.held() is not None
    seconds = math.inf if alone else inline_seconds()
    start = (yield from _here(opener, args, items, counter, seconds)) if seconds > 0 else 0
    if start < len(items):
        from . import emulator_pool
        rest = items[start:]
        for index, result in emulator_pool.run(opener, args, rest, min(worker_count(), len(rest)), what, counter):
            yield start + index, result


def _here(opener: str, args: tuple, items: list, counter, seconds: float):
    """Runs the job's items in this process, from the first, while it looks small (seconds = inf: all of them);
    returns the index of the first item left for the workers (len(items): none). A first item that alone took
    `seconds` (its session opened in it) hands the rest over at once; else the second item's time, times the items
    left, decides for the whole job: over `seconds`, the workers take the rest (this session is closed first: a
    worker opens its own)."""
    from .emulator_pool import resolve
    with holding_slot(pin=True):
        apply = resolve(opener)(*args)
        small = False
        for index, item in enumerate(items):
            began = _now()
            result = apply(item)
            took = _now() - began
            if counter is not None:
                counter.done += 1
            yield index, result
            left = len(items) - index - 1
            if small or not left:
                continue
            if index == 0 and took >= seconds:
                return 1
            if index == 1:
                if took * left > seconds:
                    return 2
                small = True
    return len(items)


def holding_slot(pin: bool = False):
    """For emulator work this process does itself, outside iter_results (an old-form evaluate hook): one of the
    machine's slots, held for the block (pin: this thread, and the session threads it starts, on the slot's core
    meanwhile, as a worker is: two sessions do not share cores)."""
    return emulator_slots.slot(waiting=_say_waiting, pin=pin)


def _say_waiting(n: int) -> None:
    print(f"waiting for an emulator slot: {n} session(s) run at once on this machine "
          f"({emulator_slots.ENV}={n}; see docs/building.md)", flush=True)


def open_binary(ctx_model, eager: bool = False, repeat_samples: int | None = None):
    """feed -> repeats.Outputs for one binary (a split graph: its parts in order), through the output memo and the
    binary's record of whether it repeats itself (_checked): the session is opened at the first feed the memo does
    not have (eager: now, so a binary the emulator cannot load fails here)."""
    from . import emulator_memo, repeats
    memo = emulator_memo.Memo(ctx_model)
    wanted = repeats.samples_to_check() if repeat_samples is None else repeat_samples
    return _checked(lambda: _open(ctx_model), memo, repeats.Record(memo.identity), wanted, eager)


def _checked(opener, memo, record, wanted: int, eager: bool = False):
    """feed -> repeats.Outputs: from the memo when the binary repeats itself and the memo has the feed; else run, and
    run again in the same session until `wanted` samples of the binary repeated themselves (or for good once one did
    not). What repeated itself, or ran once on a binary that does, is kept in the memo; nothing else is."""
    from . import repeats
    session = opener() if eager else None

    def run(feed: dict) -> dict:
        nonlocal session
        feed, twice = _plain(feed)
        if twice is None:  # (a caller outside _through_memo: the record decides)
            twice = not record.checked(wanted)
        if record.unstable() is None:
            outputs = memo.get(feed)
            if outputs is not None:
                return repeats.Outputs(outputs)
        if session is None:
            session = opener()
        first = session(feed)
        sample = repeats.Outputs(first, [session(feed)]) if twice else repeats.Outputs(first)
        _keep(memo, record, feed, sample)
        return sample

    return run


# A feed's key saying whether the sample runs twice (set by _through_memo for the job, removed before the session)
TWICE = "build_rules_run_twice"


def _plain(feed: dict) -> tuple[dict, bool | None]:
    """The feed without the TWICE key, and its value (None: not set)."""
    if TWICE not in feed:
        return feed, None
    plain = dict(feed)
    return plain, plain.pop(TWICE)


def _keep(memo, record, feed: dict, sample) -> None:
    """A sample that ran twice goes in the binary's record, and in the memo only when it repeated itself; one that ran
    once goes in the memo unless the binary is known not to repeat itself."""
    if sample.others:
        record.note(sample)  # memoized by _through_memo once the job showed no difference
    elif record.unstable() is None:
        memo.put(feed, dict(sample))


def repeat_record(ctx_model) -> dict:
    """What is known of whether this binary repeats itself: {"equal": samples that ran twice alike, "unstable": the
    first difference or None} (repeats.Record)."""
    from . import emulator_memo, repeats
    return repeats.Record(emulator_memo.Memo(ctx_model).identity).load()


class EmulatorCompileError(RuntimeError):
    """The emulator could not compile a model in-process (run_model_outputs)."""


def iter_model_outputs(model, inputs: list[dict], *, soc_model: int, vtcm_mb: int, fp16: bool = False,
                       what: str = "emulator samples", repeat_samples: int | None = None) -> Iterator[tuple[int, dict]]:
    """A float or QDQ model (a path or ONNX bytes) compiled in-process for one SoC, as tune's candidates and diagnose
    run it (ort_qnn.emulator_session: no context binary written): (index, outputs) over the inputs in order, each
    worker compiling it once; closing it stops the rest (an early verdict). Through the output memo, keyed by the
    model's bytes and the compile options, and its record of whether it repeats itself (as iter_outputs: each of
    its first `repeat_samples` samples runs twice). Raises EmulatorCompileError when it does not compile."""
    from pathlib import Path

    from . import emulator_memo, repeats
    data = model if isinstance(model, bytes) else Path(model).read_bytes()
    options = {"soc_model": soc_model, "vtcm_mb": vtcm_mb, "fp16": fp16}
    wanted = repeats.samples_to_check() if repeat_samples is None else repeat_samples
    memo = emulator_memo.Memo(model=data, options=options)
    yield from _through_memo(memo, repeats.Record(memo.identity),
                             lambda items, counter: iter_results("build_rules.emulator.emulator_runs:open_model",
                                                                 (data, options, wanted), items, what, counter),
                             inputs, what, wanted)


def run_model_outputs(model, inputs: list[dict], **options) -> list[dict]:
    """iter_model_outputs' outputs of every sample, in order."""
    return [outputs for _, outputs in iter_model_outputs(model, inputs, **options)]


def model_repeat_record(model, *, soc_model: int, vtcm_mb: int, fp16: bool = False) -> dict:
    """repeat_record() of a model compiled in-process with these options."""
    from pathlib import Path

    from . import emulator_memo, repeats
    data = model if isinstance(model, bytes) else Path(model).read_bytes()
    options = {"soc_model": soc_model, "vtcm_mb": vtcm_mb, "fp16": fp16}
    return repeats.Record(emulator_memo.Memo(model=data, options=options).identity).load()


def open_model(data: bytes, options: dict, repeat_samples: int | None = None):
    """feed -> repeats.Outputs of a model compiled in-process now (run_model_outputs' workers), through the output
    memo and its repeat record (_checked)."""
    from . import emulator_memo, repeats
    from ..toolchains import ort_qnn
    try:
        session = ort_qnn.emulator_session(data, **options)
    except Exception as e:  # onnxruntime raises its own exception types
        raise EmulatorCompileError(f"{type(e).__name__}: {str(e).strip()[:600]}") from None
    names = [o.name for o in session.get_outputs()]
    memo = emulator_memo.Memo(model=data, options=options)
    wanted = repeats.samples_to_check() if repeat_samples is None else repeat_samples
    return _checked(lambda: (lambda feed: dict(zip(names, session.run(names, feed)))), memo,
                    repeats.Record(memo.identity), wanted, eager=True)


def _open(ctx_model):
    if isinstance(ctx_model, (list, tuple)):  # a split graph: its parts' binaries, in order (chain.py)
        from . import chain
        return chain.open_on_emulator(list(ctx_model))
    from ..toolchains import ort_qnn
    return ort_qnn.open_context_binary(ctx_model)


def _open_twice(ctx_model):
    """feed -> repeats.Outputs of two runs in one session (a Ray task's opener while the binary's record is open)."""
    from . import repeats
    session = _open(ctx_model)
    return lambda feed: repeats.Outputs(session(feed), [session(feed)])

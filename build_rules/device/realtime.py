"""The real-time factor and first-output latency of a model whose evaluate hook runs over audio (seed guide step 5:
RTF = processing time / audio duration), from the phone's per-graph latencies and the float evaluation.

Nothing here knows a model. Two facts come from the float model's evaluation (evaluate:<model>/float, its
model.evaluate.json):
  - `audio_seconds` among the evaluate hook's metrics: how much audio the hook ran over (a hook that runs over audio
    returns it; a model whose hook returns none has no real-time factor, and profile says so by leaving it out);
  - `graph_runs`: how often the hook ran each graph over that audio, in the order it first ran them (the evaluate
    stage counts them), e.g. Whisper: the encoder once per clip and the step decoder once per token.
Processing time = sum over graphs of runs x the phone's steady-state median; RTF = processing / audio duration.
First-output latency = one steady-state run of each graph in the order the hook first ran them: the time from the
audio in hand to the first output of the last graph of the chain (Whisper: the encoder and one decoder step; its
first text token needs the prompt's steps too: see per_utterance_ms). Warm model, steady medians: not the context
load, which profile reports apart.
"""
from __future__ import annotations

import json
from pathlib import Path


def read_evaluation(path: str | Path | None) -> dict | None:
    """The float evaluation's report, or None without an [evaluate] (or before evaluate:<model>/float ran)."""
    if not path:
        return None
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def realtime(evaluation: dict | None, medians_ms: dict[str, float]) -> dict | None:
    """{rtf, processing_ms, audio_seconds, first_output_ms, ...} or None when the hook ran over no audio.

    medians_ms: graph -> the phone's steady-state median (ms). A graph the hook ran that the phone did not time
    gives {"measured": False, "reason": ...} rather than a factor that leaves it out."""
    if not evaluation:
        return None
    metrics = evaluation.get("metrics") or {}
    audio = metrics.get("audio_seconds")
    if audio is None:
        return None
    runs = evaluation.get("graph_runs") or {}
    if not audio > 0 or not runs:
        return {"measured": False, "reason": f"the float evaluation ran over audio_seconds = {audio} with graph runs "
                                             f"{runs}: no processing time to set against the audio"}
    missing = [g for g in runs if medians_ms.get(g) is None]
    if missing:
        return {"measured": False, "reason": f"the evaluate hook runs {', '.join(missing)}, which the phone did not "
                                             "time (no latency for it in this profile)"}
    processing = sum(count * medians_ms[g] for g, count in runs.items())
    utterances = metrics.get("utterances")
    record = {"measured": True, "audio_seconds": audio, "graph_runs": dict(runs), "processing_ms": processing,
              "rtf": processing / 1000.0 / audio, "first_output_ms": sum(medians_ms[g] for g in runs),
              "first_output_graphs": list(runs)}
    if utterances:
        record["utterances"] = int(utterances)
        record["per_utterance_ms"] = processing / utterances
        record["audio_seconds_per_utterance"] = audio / utterances
    return record

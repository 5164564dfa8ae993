"""Stage 0, data: the model's prepare_data hook makes its real inputs (e.g. speech clips from text).

The hook writes into a fresh folder; data.json then lists every file with its size and xxh3, so
the stages that read the data depend on one small file whose bytes change exactly when the data do.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import BuildError
from ..plumbing.files import atomic_write_json
from ..build_state.hashing import file_digest
from ..measuring.samples import load_hooks


def run(params: dict) -> dict:
    hooks = load_hooks(params["hooks"])
    if not hasattr(hooks, "prepare_data"):
        raise BuildError(f"{params['hooks']}: model.toml lists data sources but the hooks have no "
                         "prepare_data(out_dir, sources)")
    out_dir = Path(params["outputs"]["dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    sources = {Path(p).name: Path(p).resolve() for p in params["sources"]}
    try:
        hooks.prepare_data(out_dir, sources)
    except (RuntimeError, OSError, ValueError) as e:  # e.g. a missing tool: the hook's message says what to install
        raise BuildError(f"{params['name']}: {e}") from e
    files = sorted(p for p in out_dir.rglob("*") if p.is_file() and p.name != "data.json")
    if not files:
        raise BuildError(f"{params['name']}: prepare_data wrote no files")
    listing = {str(p.relative_to(out_dir)): {"bytes": p.stat().st_size, "xxh3_128": file_digest(p)} for p in files}
    atomic_write_json(params["outputs"]["manifest"], {"files": listing})
    return {"files": len(listing)}

"""The build state: every file build_rules keeps in out/.build-state/, in one place (as ninja documents its build
log and deps log). Nothing here is a build output: `rm -rf out/.build-state` makes the next build check every task
again (and re-run those whose outputs it cannot vouch for), never a wrong one. Light: a leaf module.

| file | what | written by | format |
|---|---|---|---|
| doit.json | doit's state per task: the key digest, each output's size, mtime and xxh3 | journal.py (doit's backend `build_rules_journal`) | JSON snapshot |
| doit.json.journal | each change to doit.json since its last snapshot, so a kill -9 forgets nothing | journal.py | one JSON object a line |
| doit.json.lock | one doit at a time per repo (holds the pid) | journal.py | lock file |
| stat-cache.json | the xxh3 of each input file by size and mtime: a touched file is read once | hashing.py (`use_stat_cache`) | JSON |
| key-digests.json | task key dicts -> their digests, so a no-op hashes no key | hashing.py (`use_key_digests`) | JSON |
| toml-cache.json | parsed chips.toml / model.toml files by the xxh3 of their bytes | config.py (`TomlCache`, via project.py) | JSON |
| build.log | one line per task run: start, seconds, ran / restored / failed, task (`python -m build_rules.build_log`) | build_log.py | tab-separated, `#` line per build |
| outputs-<toolchain>-<digest>.json | the paths the build's tasks write: a later build removes those of targets that left it | target_set.py | JSON |
| remote-cache.json | this repo's use of the remote build cache: hits, uploads, failures | remote_cache.py | JSON |
| <toolchain>-identity-<digest>.json | the toolchain's identity (versions, QNN build id), read once per installed version | toolchains/ort_qnn.py, toolchains/qairt.py | JSON |
| emulator-outputs/<2 hex>/<key>.npz | the HTP emulator's outputs by binary, input bytes and runtime version; bounded, least recently used go first | emulator_memo.py | npz |
| emulator-repeats/<2 hex>/<binary>.json | whether a binary repeats itself on the emulator: samples that ran twice with equal bytes, or the first that did not | repeats.py | JSON |
| cpu-measurements/<key>.jsonl | tune's CPU switch-model measurements by switch model, samples, hooks and runtime: a second tune reuses them | stages/support/tune_memo.py | one JSON object a line |
| emulator-measurements/<key>.jsonl | tune's emulator measurements of candidates by the variant's QDQ model, chip, samples, hooks and runtime: a second tune reuses them | stages/support/tune_memo.py | one JSON object a line |
"""
from __future__ import annotations

from .layout import OUT

STATE_DIR = f"{OUT}/.build-state"
DOIT_DB = f"{STATE_DIR}/doit.json"  # + .journal, .lock (journal.py)
STAT_CACHE = f"{STATE_DIR}/stat-cache.json"
KEY_DIGESTS = f"{STATE_DIR}/key-digests.json"
TOML_CACHE = f"{STATE_DIR}/toml-cache.json"
BUILD_LOG = f"{STATE_DIR}/build.log"
REMOTE_CACHE_STATS = f"{STATE_DIR}/remote-cache.json"
EMULATOR_OUTPUTS = f"{STATE_DIR}/emulator-outputs"  # emulator_memo.py
EMULATOR_REPEATS = f"{STATE_DIR}/emulator-repeats"  # repeats.py
CPU_MEASUREMENTS = f"{STATE_DIR}/cpu-measurements"  # stages/support/tune_memo.py
EMULATOR_MEASUREMENTS = f"{STATE_DIR}/emulator-measurements"  # stages/support/tune_memo.py
OUTPUTS_PREFIX = "outputs-"  # outputs-<toolchain>-<digest>.json (target_set.py)

"""What a build keeps between runs, under out/: where every output lives (layout), the files of
out/.build-state (state), content hashes and task keys (hashing), the last result of a check (results), the
build cache's S3 tier (remote_cache). The root's cache.py (local tier), journal.py (doit's state) and
build_log.py sit on these.

May import: errors, plumbing, quantization, configuration, stage_table.
"""

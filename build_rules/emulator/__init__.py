"""The HTP emulator's one door (emulator_runs) and what stands behind it: worker processes (emulator_pool), the
machine-wide session limit (emulator_slots), the output memo (emulator_memo), Ray clusters (emulator_ray),
whether a binary repeats itself (repeats), a split graph's parts run in order (chain).

May import: everything below it (errors, plumbing, quantization, configuration, stage_table, build_state,
measuring, the root's cache, build_log, journal and runner, toolchains).
"""

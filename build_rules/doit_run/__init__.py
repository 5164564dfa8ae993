"""One doit run: the project it loads (project: config, toolchain, task keys, the stage task dict), what it will
run and how long (plan), what it does at its start and end (run_hooks: target_set's stale outputs, bytecode),
when Python's garbage collector runs (collector). Light: doit loads it on every run.

May import: everything below it (... emulator, bundles, the root's dist).
"""

"""On the phone (pipeline step 10; issue 29): the same binaries on a real device over adb.

devices.py   the repo's phones (devices.toml [devices.<name>]) and `python -m build_rules.device list`/`clean`
named.py     devices.toml as this build reads it, and why a device task of a phone does not exist
adb.py       adb as a subprocess: devices -l, getprop, shell (remote exit code kept), push, pull
runtime.py   the QNN runtime for Android the phone needs (QNN_SDK_ROOT or BUILD_RULES_QNN_RUNTIME)
push.py      push only what the phone lacks, by content hash
target.py    what runs on the phone for one graph, whichever toolchain made it: its parts and their I/O contracts
on_phone.py  a graph's parts in order on the phone (a split graph's crossing tensors handed on)
realtime.py  the real-time factor and first-output latency of a model whose evaluate hook runs over audio
cpu_runtime.py, cpu_baseline.py, ort_cpu_run.c   the CPU baseline: the float graph with ONNX Runtime on the phone's CPU
device_check.py, profile.py, power.py   the three device tasks' actions
None of these is imported by `doit list`'s path except devices.py and named.py (TOML only; no adb).
"""

"""On the phone (pipeline step 10; issue 29): the same binaries on a real device over adb.

devices.py   the repo's phones (devices.toml [devices.<name>]) and `python -m build_rules.device list`
adb.py       adb as a subprocess: devices -l, getprop, shell (remote exit code kept), push, pull
runtime.py   the QNN runtime for Android the phone needs (QNN_SDK_ROOT or BUILD_RULES_QNN_RUNTIME)
push.py      push only what the phone lacks, by content hash
device_check.py, profile.py, power.py   the three device tasks' actions
None of these is imported by `doit list`'s path except devices.py (TOML only; it never calls adb).
"""

"""Reads the build id of a QNN HTP backend library (libQnnHtp.so) through the QNN C API.

Shared by both toolchains: ort-qnn probes the libQnnHtp.so inside the onnxruntime-qnn wheel, qairt the one at
$QNN_SDK_ROOT/lib/x86_64-linux-clang/. Standard library only: this runs (rarely, results are cached by the
callers) while doit loads the build file.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

# Runs in a child process so that a crash inside the 100 MB HTP library cannot take the build tool down, and so
# that the library is never mapped into the build process just to read one string.
_PROBE = r"""
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
class Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("patch", ctypes.c_uint32)]
class Interface(ctypes.Structure):
    # QnnInterface_t: backendId, providerName, apiVersion{core, backend}, then the table of function pointers.
    _fields_ = [("backend_id", ctypes.c_uint32), ("provider_name", ctypes.c_char_p),
                ("core_api", Version), ("backend_api", Version), ("fns", ctypes.c_void_p * 5)]
get_providers = lib.QnnInterface_getProviders
get_providers.restype = ctypes.c_uint64  # Qnn_ErrorHandle_t
get_providers.argtypes = [ctypes.POINTER(ctypes.POINTER(ctypes.POINTER(Interface))), ctypes.POINTER(ctypes.c_uint32)]
providers = ctypes.POINTER(ctypes.POINTER(Interface))()
count = ctypes.c_uint32()
rc = get_providers(ctypes.byref(providers), ctypes.byref(count))
if rc != 0 or count.value < 1:
    sys.exit("QnnInterface_getProviders failed: rc=%d, %d provider(s)" % (rc, count.value))
p = providers[0].contents
# Function pointer #4 of QNN_INTERFACE_VER_TYPE is backendGetBuildId(const char**).
get_build_id = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.POINTER(ctypes.c_char_p))(p.fns[4])
build_id = ctypes.c_char_p()
rc = get_build_id(ctypes.byref(build_id))
if rc != 0 or not build_id.value:
    sys.exit("backendGetBuildId failed: rc=%d" % rc)
v = lambda x: "%d.%d.%d" % (x.major, x.minor, x.patch)
sys.stdout.write("\nQNN_PROBE_JSON " + json.dumps({
    "build_id": build_id.value.decode(), "provider": (p.provider_name or b"").decode(),
    "backend_id": p.backend_id, "core_api": v(p.core_api), "backend_api": v(p.backend_api)}) + "\n")
"""


def probe_build_id(lib: Path) -> dict[str, Any]:
    """Ask libQnnHtp for its build id through the QNN C API (in a child process)."""
    proc = subprocess.run([sys.executable, "-c", _PROBE, str(lib)], capture_output=True, text=True, timeout=300)
    for line in proc.stdout.splitlines():
        if line.startswith("QNN_PROBE_JSON "):
            return json.loads(line[len("QNN_PROBE_JSON "):])
    raise RuntimeError(f"could not read the QNN build id from {lib} (exit code {proc.returncode}): "
                       f"{(proc.stderr or proc.stdout).strip()[-2000:]}")

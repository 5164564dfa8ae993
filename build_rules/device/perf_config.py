"""How profile asks qnn-net-run for an HTP performance profile (burst, ...), by the runtime's version.

QAIRT's qnn-net-run usage text: "--perf_profile ... Note: perf_profile argument is now deprecated for HTP backend,
user can specify performance profile through backend extension config now." The backend extension config is
`--config_file <json>` naming the HTP extensions library and its own config:

  {"backend_extensions": {"shared_library_path": ".../libQnnHtpNetRunExtensions.so",
                          "config_file_path": ".../htp_perf_<profile>.json"}}
  htp_perf_<profile>.json: {"devices": [{"device_id": 0, "cores": [{"core_id": 0, "perf_profile": "<profile>"}]}]}

(the HTP backend extensions' "devices" section, its cores' perf_profile; QNN HTP backend docs). The version the
note first appeared in was not found in the docs at hand; CONFIG_SINCE is the oldest QAIRT whose docs were read
here (2.39), and every runtime that loads this project's binaries (QNN 2.51 and newer) is past it. A runtime older
than that, or of unknown version (no sdk.yaml), gets `--perf_profile`, which every version takes.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from .devices import REMOTE_ROOT
from .errors import DeviceError

CONFIG_SINCE = (2, 39)
EXTENSIONS = "libQnnHtpNetRunExtensions.so"
REMOTE_CONFIG = f"{REMOTE_ROOT}/config"


def uses_config(version: str | None) -> bool:
    found = re.match(r"(\d+)\.(\d+)", version or "")
    return bool(found) and (int(found.group(1)), int(found.group(2))) >= CONFIG_SINCE


def request(version: str | None, profile: str, root: Path, folder: Path, remote_runtime: str,
            where: str) -> tuple[tuple, dict, str]:
    """(qnn-net-run flags, files to push (remote -> local), the form's name) for `profile` on this runtime."""
    if not uses_config(version):
        return ("--perf_profile", profile), {}, "--perf_profile"
    library = root / "lib" / "aarch64-android" / EXTENSIONS
    if not library.is_file():
        raise DeviceError(f"{where}: the QNN runtime at {root} (QAIRT {version}) lacks "
                          f"lib/aarch64-android/{EXTENSIONS}: its qnn-net-run takes the HTP performance profile through that backend extension "
                          "(--perf_profile is deprecated for HTP); copy it from the same QAIRT SDK")
    folder.mkdir(parents=True, exist_ok=True)
    htp = folder / f"htp_perf_{profile}.json"
    htp.write_text(json.dumps({"devices": [{"device_id": 0, "cores": [{"core_id": 0, "perf_profile": profile}]}]},
                              indent=2) + "\n")
    config = folder / f"netrun_{profile}.json"
    config.write_text(json.dumps({"backend_extensions": {
        "shared_library_path": f"{remote_runtime}/{EXTENSIONS}",
        "config_file_path": f"{REMOTE_CONFIG}/{htp.name}"}}, indent=2) + "\n")
    files = {f"{remote_runtime}/{EXTENSIONS}": library, f"{REMOTE_CONFIG}/{htp.name}": htp,
             f"{REMOTE_CONFIG}/{config.name}": config}
    return ("--config_file", f"{REMOTE_CONFIG}/{config.name}"), files, "backend extension config"

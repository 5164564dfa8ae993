"""What native code writes to the process's stderr (file descriptor 2, which sys.stderr does not see), or stdout,
while a call runs, as lines for the caller to print its own way. onnxsim's C++ constant folding writes a `WARNING:
failed to run "<op>" op (name is "<node>"), skip... <why>` line per node it cannot fold, on every folding pass: eleven
of the twelve lines of YOLOv8n's simplify log (stages/simplify.py prints them as one). Standard library only."""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator

# The x86 HTP emulator's HVX library prints this line on stdout for every session it opens (its thread-local-storage
# setting): hundreds of lines in a tune's log, nothing a reader can act on.
EMULATOR_NOISE = " # LIBNATIVE: "


@contextlib.contextmanager
def captured(fd: int = 2) -> Iterator[list[str]]:
    """Within the block, file descriptor `fd` (2: stderr, 1: stdout) goes to a temporary file; on the way out (an
    exception too) its lines are appended to the list the block got, and the descriptor is back where it was."""
    lines: list[str] = []
    stream = sys.stdout if fd == 1 else sys.stderr
    stream.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as kept:
        os.dup2(kept.fileno(), fd)
        try:
            yield lines
        finally:
            stream.flush()
            os.dup2(saved, fd)
            os.close(saved)
            kept.seek(0)
            lines.extend(kept.read().decode(errors="replace").splitlines())

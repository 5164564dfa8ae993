"""What native code writes to the process's stderr (file descriptor 2, which sys.stderr does not see) while a call
runs, as lines for the caller to print its own way. onnxsim's C++ constant folding writes a `WARNING: failed to run
"<op>" op (name is "<node>"), skip... <why>` line per node it cannot fold, on every folding pass: eleven of the twelve
lines of YOLOv8n's simplify log (stages/simplify.py prints them as one). Standard library only."""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def captured() -> Iterator[list[str]]:
    """Within the block, file descriptor 2 goes to a temporary file; on the way out (an exception too) its lines are
    appended to the list the block got, and stderr is back where it was."""
    lines: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as kept:
        os.dup2(kept.fileno(), 2)
        try:
            yield lines
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            kept.seek(0)
            lines.extend(kept.read().decode(errors="replace").splitlines())

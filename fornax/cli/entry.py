"""The ``fornax`` command's entry point: Ctrl-C while the command is still loading (importing
torch, JAX and fornax takes seconds) ends it as an interrupt during the command does, with
one line and rc 130, not a traceback from inside an import."""

from __future__ import annotations

import os
import sys


def main() -> None:
    try:
        from .main import main as command
    except KeyboardInterrupt:
        sys.stderr.write("fornax: error: interrupted\n")
        sys.stderr.flush()
        os._exit(130)
    command()

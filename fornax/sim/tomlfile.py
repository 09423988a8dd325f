"""Reading a TOML file a user hands fornax (stack config, chip spec, vendor facts, tables).

Every loader reads its file through :func:`read`, so every one refuses the same bad input
the same way: a missing path, a folder, an unreadable file, binary garbage (not UTF-8
text), an oversized file and malformed TOML are each one line naming the file, raised as
the caller's own error type.  Nothing in the file is executed: TOML is data.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

#: no configuration file fornax reads comes near this; anything larger is not one
MAX_BYTES = 16 * 2**20


def read(path: str | Path, what: str, error: type[Exception]) -> dict[str, Any]:
    """The TOML document in ``path`` (``what`` names it in messages, e.g. "chip spec file");
    any problem is ``error(message)``."""
    path = Path(path)
    if path.is_dir():
        raise error(f"{what} {path} is a folder, not a file")
    if not path.exists():
        raise error(f"{what} {path} does not exist")
    if not path.is_file():
        raise error(f"{what} {path} is not a regular file")
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise error(f"{what} {path} is {size} bytes; a TOML file fornax reads is at most "
                        f"{MAX_BYTES} bytes")
        raw = path.read_bytes()
    except OSError as exc:
        raise error(f"{what} {path}: cannot read it: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{what} {path} is not UTF-8 text (byte {exc.start} is {raw[exc.start]:#04x}); "
                    f"TOML files are UTF-8 text") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{what} {path} is not valid TOML: {exc}") from None

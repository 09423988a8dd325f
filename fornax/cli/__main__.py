"""``python -m fornax.cli``: the fornax command."""

from .entry import main

main()

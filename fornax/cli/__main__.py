"""``python -m fornax.cli``: the fornax command."""

from .main import main

main()

"""``python -m fornax.fuzz --cases N``: every loader target, N cases each."""

from .loaders import main

raise SystemExit(main())

"""The rocm-like family's facts: vendor.toml, read once and checked against the schema."""

from __future__ import annotations

from typing import Any

from ..facts_loader import load_facts

FACTS: dict[str, Any] = load_facts(__package__ or __name__.rpartition(".")[0])

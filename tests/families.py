"""The families the per-family tests run on, each with capability tags read from its facts.

As a conformance suite does for its backends (IREE's CTS tags each driver with what it can do),
a test that depends on a feature asks for the tag, not for a family's name: a fourth family
registered through ``fornax.vendors`` gets the same tests, and the tags come from its
``vendor.toml``. Expected failures are data too: ``tests/expected_failures.toml`` lists, per
family, test ids that are known to fail with the reason; they run as strict xfails, so a fixed
one (or a stale entry) fails the suite.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fornax.stack import BUILTIN_FAMILIES, get_vendor

#: the table (FORNAX_EXPECTED_FAILURES names another file: how tests/test_families.py checks
#: the mechanism itself)
EXPECTED_FAILURES = Path(os.environ.get("FORNAX_EXPECTED_FAILURES")
                         or Path(__file__).with_name("expected_failures.toml"))

#: every capability tag, with the vendor.toml fact it comes from
CAPABILITIES = {
    "peer-access-explicit": "[driver.peer] rule = 'explicit' (query, then enable per direction)",
    "peer-access-query": "[driver.peer] rule = 'query' (peers reachable once the query says so)",
    "managed-migration": "[driver.managed] device_access = 'migrate' (pages move on first touch)",
    "thread-current-context": "[driver.contexts] current = 'thread' (a per-thread context stack)",
    "device-current-context": "[driver.contexts] current = 'device' (the current device per thread)",
    "explicit-context": "[driver.contexts] current = 'explicit' (every call names its context)",
    "packet-queues": "[driver] queue = 'aql' (user-mode packet rings with signals)",
    "graph-capture": "[runtime.graph] supported = true (stream capture and replay)",
    "out-of-order-queues": "[runtime] out_of_order = true (created queues are out of order)",
    "legacy-default-stream": "[runtime] default_stream = 'legacy' (it syncs with blocking streams)",
    "per-thread-default-stream": "[runtime] per_thread_supported = true",
    "malloc-blocks": "[runtime] blocking holds 'malloc' (allocation synchronises the device)",
    "free-blocks": "[runtime] blocking holds 'free'",
    "event-timing-flag": "[runtime] event_timing = 'event' (timing is an event flag, not a queue property)",
}


def capabilities(facts: dict[str, Any]) -> frozenset[str]:
    """The capability tags a family's facts declare."""
    d, r = facts.get("driver", {}), facts.get("runtime", {})
    tags = set()
    rule = d.get("peer", {}).get("rule")
    if rule in ("explicit", "query"):
        tags.add(f"peer-access-{rule}")
    if d.get("managed", {}).get("device_access") == "migrate":
        tags.add("managed-migration")
    current = d.get("contexts", {}).get("current")
    if current in ("thread", "device"):
        tags.add(f"{current}-current-context")
    elif current == "explicit":
        tags.add("explicit-context")
    if d.get("queue") == "aql":
        tags.add("packet-queues")
    if r.get("graph", {}).get("supported"):
        tags.add("graph-capture")
    if r.get("out_of_order"):
        tags.add("out-of-order-queues")
    if r.get("default_stream") == "legacy":
        tags.add("legacy-default-stream")
    if r.get("per_thread_supported"):
        tags.add("per-thread-default-stream")
    for call in r.get("blocking", ()):
        if f"{call}-blocks" in CAPABILITIES:
            tags.add(f"{call}-blocks")
    if r.get("event_timing") == "event":
        tags.add("event-timing-flag")
    return frozenset(tags)


@dataclass(frozen=True)
class Family:
    """A vendor family under test: its name, facts and capability tags."""

    name: str
    facts: dict[str, Any]
    caps: frozenset[str]

    def has(self, tag: str) -> bool:
        if tag not in CAPABILITIES:
            raise KeyError(f"unknown capability tag {tag!r} (known: {', '.join(sorted(CAPABILITIES))})")
        return tag in self.caps

    def __str__(self) -> str:
        return self.name


def family(name: str) -> Family:
    facts = get_vendor(name).facts
    return Family(name, facts, capabilities(facts))


FAMILY_OBJECTS = tuple(family(n) for n in BUILTIN_FAMILIES)


def expected_failures() -> dict[str, dict[str, str]]:
    """family -> {test id (``path::name[params]``) -> reason} from tests/expected_failures.toml."""
    table = tomllib.loads(EXPECTED_FAILURES.read_text())
    unknown = set(table) - set(BUILTIN_FAMILIES)
    if unknown:
        raise ValueError(f"{EXPECTED_FAILURES.name}: unknown families {sorted(unknown)}")
    for fam, rows in table.items():
        for test_id, reason in rows.items():
            if not isinstance(reason, str) or not reason.strip():
                raise ValueError(f"{EXPECTED_FAILURES.name}: [{fam}] {test_id!r} needs a reason")
    return table

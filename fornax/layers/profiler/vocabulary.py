"""A family's profiling vocabulary, read from the ``[profiler]`` table of its ``vendor.toml``:
the callback domains, callback ids, callback sites, activity kinds, copy kinds, record field
names, metric names and error codes.  Shared code speaks fornax's generic names (domains
``runtime``/``driver``; kinds ``kernel``/``memcpy``/``runtime``/``driver``; metric keys of
:mod:`.metrics`) and asks the vocabulary for the family's."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError, ErrorTable, FornaxError
from .records import ApiRecord, CopyActivity, KernelActivity, Record

DOMAINS = ("runtime", "driver")
KINDS = ("kernel", "memcpy", "runtime", "driver")


def api_base(name: str) -> str:
    """An API name without its decorations: ``cudaMemcpyAsync(HostToDevice)`` ->
    ``cudaMemcpyAsync``; ``sycl::queue::memcpy(...).wait()`` -> ``sycl::queue::memcpy``."""
    return name.split("(", 1)[0].split(" ", 1)[0].strip() or name


class Vocabulary:
    """The ``[profiler]`` facts of a family, with the runtime's and driver's API names."""

    def __init__(self, facts: dict[str, Any], vendor: str, runtime_calls: dict[str, str],
                 driver_calls: dict[str, str]):
        p = facts.get("profiler")
        if p is None:
            raise ConfigError(f"{vendor} has no [profiler] table: it ships no profiling interface",
                              seam="runtime", vendor=vendor,
                              hint="docs/profiling.md lists the facts a family's profiler reads")
        self.vendor = vendor
        self.facts = p
        self.api: str = p["api"]
        e = p["errors"]
        self.errors = ErrorTable(e["api"], e["codes"], e["conditions"], seam="runtime",
                                 vendor=vendor, hex=e.get("hex", False))
        self.calls = {"runtime": dict(runtime_calls), "driver": dict(driver_calls)}
        self.domains: dict[str, str] = dict(p["domains"])
        self.kinds: dict[str, str] = dict(p["activity_kinds"])
        self.copy_kinds: dict[str, str] = dict(p["copy_kinds"])
        self.sites: dict[str, str] = dict(p["sites"])
        self.record_bytes: dict[str, int] = {k: int(v) for k, v in p["record_bytes"].items()}
        self.metric_names: dict[str, dict[str, Any]] = dict(p["metrics"])
        self.summary: dict[str, Any] = dict(p["summary"])
        self._ids = {d: {api_base(n): c for c, n in calls.items()} for d, calls in self.calls.items()}

    # -- errors ------------------------------------------------------------------------------
    def fail(self, condition: str, message: str, call: str, hint: str | None = None) -> FornaxError:
        """The family's error for ``condition`` (a ``[profiler.errors.conditions]`` name)
        raised by the profiling call ``call`` (the family's name for it)."""
        name = self.errors.faults.get(condition) or self.errors.faults["unknown"]
        return self.errors.error(name, message, op=call, hint=hint)

    # -- names ---------------------------------------------------------------------------------
    def _generic(self, table: dict[str, str], name: str, condition: str, what: str, call: str) -> str:
        """fornax's name for the family's ``name`` in ``table`` (an error names the known ones)."""
        for generic, family in table.items():
            if family == name:
                return generic
        raise self.fail(condition, f"unknown {what} {name!r}", call,
                        hint=f"use one of {', '.join(table.values())}")

    def domain(self, name: str, call: str) -> str:
        """fornax's domain for the family's callback domain ``name``."""
        return self._generic(self.domains, name, "invalid_domain", "callback domain", call)

    def callback_id(self, domain: str, api_name: str) -> str:
        """The family's callback id of an API call of ``domain`` (its ``[profiler.callback_ids]``
        template, or the template of the longest prefix of the name that it lists)."""
        base = api_base(api_name)
        templates = self.facts["callback_ids"][domain]
        if isinstance(templates, dict):
            prefix = max((p for p in templates if base.startswith(p)), key=len)
            templates = templates[prefix]
        return str(templates).format(name=base)

    def callback_ids(self, domain: str) -> dict[str, str]:
        """The family's callback id -> fornax's generic call, for every call of ``domain``."""
        return {self.callback_id(domain, n): c for c, n in self.calls[domain].items()}

    def call_of(self, domain: str, cbid: str, call: str) -> str:
        """fornax's generic call for the family's callback id ``cbid`` of ``domain``."""
        ids = self.callback_ids(domain)
        if cbid not in ids:
            raise self.fail("invalid_call", f"{cbid!r} is no API call of {self.domains[domain]}", call,
                            hint=f"known: {', '.join(sorted(ids))}")
        return ids[cbid]

    def kind(self, name: str, call: str) -> str:
        """fornax's activity kind for the family's kind ``name``."""
        return self._generic(self.kinds, name, "invalid_kind", "activity kind", call)

    def largest_record(self) -> int:
        return max(self.record_bytes.values())

    def record_size(self, record: Record) -> int:
        return self.record_bytes["api" if isinstance(record, ApiRecord) else record.kind]

    # -- records in the family's field names -----------------------------------------------------
    def render(self, record: Record) -> dict[str, Any]:
        """``record`` as the family's record: its kind and its field names; timestamps in
        nanoseconds of simulated time, as the real records carry them."""
        if isinstance(record, KernelActivity):
            f = self.facts["fields"]["kernel"]
            out: dict[str, Any] = {f["kind"]: self.kinds["kernel"], f["name"]: record.name,
                                   f["device"]: record.device, f["queue"]: record.queue,
                                   f["correlation"]: record.correlation}
            names = str(f["grid"]).split(",")
            if len(names) == 3:
                out.update(zip(names, record.grid))
            else:
                out[names[0]] = list(record.grid)
        elif isinstance(record, CopyActivity):
            f = self.facts["fields"]["memcpy"]
            out = {f["kind"]: self.kinds["memcpy"], f["copy_kind"]: self.copy_kinds[record.direction],
                   f["bytes"]: record.bytes, f["device"]: record.device, f["queue"]: record.queue,
                   f["correlation"]: record.correlation}
        else:
            f = self.facts["fields"]["api"]
            out = {f["kind"]: self.kinds[record.domain],
                   f["call"]: self.callback_id(record.domain, record.name),
                   f["correlation"]: record.correlation, f["thread"]: record.thread}
        out[f["start"]] = round(record.start_s * 1e9)
        out[f["end"]] = round(record.end_s * 1e9)
        return out

    def metrics(self, values: dict[str, float]) -> dict[str, float]:
        """Metric values under the family's names and units (fornax's keys the family has no
        name for are left out)."""
        out = {}
        for key, value in values.items():
            entry = self.metric_names.get(key)
            if entry is not None:
                out[str(entry["name"])] = value * float(entry.get("scale", 1.0))
        return out

    def metric_unit(self, key: str) -> tuple[str, str] | None:
        """(the family's name, its unit) of fornax's metric ``key``, or None."""
        entry = self.metric_names.get(key)
        return None if entry is None else (str(entry["name"]), str(entry["unit"]))

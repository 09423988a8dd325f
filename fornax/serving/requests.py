"""What a serving run is asked to do: a trace of requests.

A :class:`Request` is a prompt (token ids), how many tokens to generate at most and when it
arrives, in simulated seconds from the start of the trace.  A trace comes from one of two
places:

* :func:`poisson_trace` — a synthetic open-loop workload, the usual way serving systems are
  benchmarked: requests arrive as a Poisson process (independent, exponentially distributed
  gaps of mean ``1 / rate``; ``rate = math.inf`` sends them all at once, the offline case),
  with prompt and output lengths drawn uniformly from inclusive ranges.  A non-zero
  ``shared_prefix`` starts every prompt with the same tokens (a common system prompt), which
  is what automatic prefix caching exploits.  Everything is drawn from one seeded NumPy
  generator, so a spec and a seed name exactly one trace.
* :func:`load_jsonl` — a recorded or hand-written trace, one JSON object per line.  Every
  problem in the file is a :class:`~fornax.layers.errors.ConfigError` naming the file, the
  line and the field.

Token ids 0 and 1 are left out of synthetic prompts (the conventional padding and
end-of-sequence ids); a JSONL prompt may use any id in ``[0, vocab)``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from fornax.layers.errors import ConfigError

#: the lowest token id a synthetic prompt uses (0 and 1 are padding / end of sequence)
FIRST_TOKEN = 2

#: the fields a JSONL line may carry
JSONL_FIELDS = ("prompt", "max_new_tokens", "arrival", "id")


@dataclass(frozen=True)
class Request:
    """One request of a trace: generate up to ``max_new_tokens`` tokens after ``prompt``.

    ``prompt`` is stored as a tuple of Python ints (a list or NumPy integers are converted).
    A request that could not be served is refused at construction: an empty id or prompt, a
    negative token id, ``max_new_tokens < 1`` or an arrival that is negative or not finite.
    """

    id: str
    prompt: tuple[int, ...]
    max_new_tokens: int
    arrival: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ConfigError(f"request id must be a non-empty string, not {self.id!r}",
                              hint="give every request a unique name")
        prompt = tuple(int(t) for t in self.prompt)
        if not prompt:
            raise ConfigError(f"request {self.id}: the prompt is empty",
                              hint="a prompt needs at least one token id")
        if min(prompt) < 0:
            raise ConfigError(f"request {self.id}: negative token id {min(prompt)} in the prompt",
                              hint="token ids are indices into the vocabulary, from 0")
        object.__setattr__(self, "prompt", prompt)
        if int(self.max_new_tokens) != self.max_new_tokens or self.max_new_tokens < 1:
            raise ConfigError(f"request {self.id}: max_new_tokens must be an integer >= 1, "
                              f"not {self.max_new_tokens!r}",
                              hint="a request generates at least one token")
        object.__setattr__(self, "max_new_tokens", int(self.max_new_tokens))
        arrival = float(self.arrival)
        if not math.isfinite(arrival) or arrival < 0:
            raise ConfigError(f"request {self.id}: arrival must be a finite time >= 0 "
                              f"(simulated seconds), not {self.arrival!r}",
                              hint="arrivals count from the start of the trace")
        object.__setattr__(self, "arrival", arrival)


@dataclass(frozen=True)
class TraceSpec:
    """A synthetic trace: how many requests, how fast they arrive, how long they are.

    ``rate`` is the mean number of arrivals per simulated second (``math.inf``: every request
    arrives at time 0).  ``prompt_len`` and ``output_len`` are inclusive ranges drawn
    uniformly; ``prompt_len`` is the whole prompt, the ``shared_prefix`` tokens included, so
    ``shared_prefix`` may be at most ``prompt_len[0]``.
    """

    requests: int = 16
    rate: float = 50.0
    prompt_len: tuple[int, int] = (8, 48)
    output_len: tuple[int, int] = (4, 16)
    shared_prefix: int = 0
    seed: int = 0

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first field that is wrong."""
        if not _is_int(self.requests) or self.requests < 1:
            raise ConfigError(f"trace spec: requests must be an integer >= 1, not {self.requests!r}",
                              hint="ask for at least one request")
        rate = self.rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or math.isnan(rate) or rate <= 0:
            raise ConfigError(f"trace spec: rate must be a number > 0 (arrivals per simulated "
                              f"second), not {rate!r}",
                              hint="use math.inf (or 'inf') to send every request at time 0")
        for name in ("prompt_len", "output_len"):
            lo_hi = getattr(self, name)
            if (not isinstance(lo_hi, tuple) or len(lo_hi) != 2 or not all(_is_int(v) for v in lo_hi)
                    or lo_hi[0] < 1 or lo_hi[0] > lo_hi[1]):
                raise ConfigError(f"trace spec: {name} must be an inclusive range (lo, hi) of "
                                  f"integers with 1 <= lo <= hi, not {lo_hi!r}",
                                  hint=f"for example {name}=(8, 48)")
        if not _is_int(self.shared_prefix) or self.shared_prefix < 0:
            raise ConfigError(f"trace spec: shared_prefix must be an integer >= 0, "
                              f"not {self.shared_prefix!r}", hint="0 turns prefix sharing off")
        if self.shared_prefix > self.prompt_len[0]:
            raise ConfigError(f"trace spec: shared_prefix ({self.shared_prefix}) is longer than the "
                              f"shortest prompt (prompt_len starts at {self.prompt_len[0]})",
                              hint="prompt_len counts the shared prefix: raise its lower bound "
                                   "or shorten the shared prefix")
        if not _is_int(self.seed):
            raise ConfigError(f"trace spec: seed must be an integer, not {self.seed!r}",
                              hint="any integer names one trace")


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_vocab(vocab: int, least: int) -> None:
    if not _is_int(vocab) or vocab < least:
        raise ConfigError(f"vocab must be an integer >= {least}, not {vocab!r}",
                          hint="pass the model's vocabulary size")


def poisson_trace(spec: TraceSpec, vocab: int) -> list[Request]:
    """The trace ``spec`` names: ``spec.requests`` requests, ids ``r0``, ``r1``, ... in arrival
    order, prompt tokens in ``[2, vocab)``.

    The first request arrives at time 0 and each later one an exponentially distributed gap
    (mean ``1 / spec.rate``) after the one before: a Poisson process observed from its first
    arrival.  Draw order is fixed (gaps, the shared prefix, then per request its prompt
    length, output length and tokens), so one seed always gives the same trace.
    """
    spec.validate()
    _check_vocab(vocab, FIRST_TOKEN + 1)
    rng = np.random.default_rng(spec.seed)
    n = spec.requests
    if math.isinf(spec.rate):
        arrivals = np.zeros(n)
    else:
        gaps = rng.exponential(1.0 / spec.rate, size=n - 1)
        arrivals = np.concatenate(([0.0], np.cumsum(gaps)))
    prefix = [int(t) for t in rng.integers(FIRST_TOKEN, vocab, size=spec.shared_prefix)]
    trace = []
    for i in range(n):
        length = int(rng.integers(spec.prompt_len[0], spec.prompt_len[1] + 1))
        out = int(rng.integers(spec.output_len[0], spec.output_len[1] + 1))
        own = rng.integers(FIRST_TOKEN, vocab, size=length - spec.shared_prefix)
        trace.append(Request(id=f"r{i}", prompt=tuple(prefix) + tuple(int(t) for t in own),
                             max_new_tokens=out, arrival=float(arrivals[i])))
    return trace


def load_jsonl(path: str | os.PathLike[str], vocab: int) -> list[Request]:
    """Read a trace: one JSON object per line, blank lines skipped.

    Each object has ``prompt`` (a non-empty list of token ids in ``[0, vocab)``),
    ``max_new_tokens`` (an integer >= 1), optionally ``arrival`` (simulated seconds >= 0,
    default 0) and ``id`` (a non-empty string, default ``r<i>`` with ``i`` the line's 0-based
    index in the file); no other field.  Ids must be unique.  The requests come back sorted
    by arrival; requests arriving together keep their file order.

    Every problem (unreadable file, bad JSON, a missing, mistyped or out-of-range field, a
    duplicate id, a file with no request) is a :class:`ConfigError` naming the file, the line
    number (from 1) and the field, with a hint.
    """
    _check_vocab(vocab, 1)
    name = os.fspath(path)
    try:
        with open(name, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{name}: cannot read the trace ({exc})",
                          hint="pass the path of a UTF-8 JSONL file, one request per line") from exc
    requests: list[Request] = []
    seen: dict[str, int] = {}
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        request = _parse_line(name, index, line, vocab)
        if request.id in seen:
            raise _line_error(name, index, "id",
                              f"duplicate id {request.id!r} (first on line {seen[request.id]})",
                              "every request needs its own id; drop the field to get r<line index>")
        seen[request.id] = index + 1
        requests.append(request)
    if not requests:
        raise ConfigError(f"{name}: the trace has no request (the file is empty or blank)",
                          hint='write one JSON object per line: {"prompt": [5, 6, 7], '
                               '"max_new_tokens": 8}')
    return sorted(requests, key=lambda r: r.arrival)


def _line_error(name: str, index: int, field_name: str | None, problem: str, hint: str) -> ConfigError:
    where = f"{name}, line {index + 1}" + (f", field {field_name!r}" if field_name else "")
    return ConfigError(f"{where}: {problem}", hint=hint)


def _parse_line(name: str, index: int, line: str, vocab: int) -> Request:
    try:
        obj: Any = json.loads(line)
    except json.JSONDecodeError as exc:
        raise _line_error(name, index, None, f"not valid JSON ({exc.msg} at column {exc.colno})",
                          "each non-blank line must be one JSON object") from exc
    if not isinstance(obj, dict):
        raise _line_error(name, index, None, f"a JSON {type(obj).__name__} is not a request",
                          'each line must be an object such as {"prompt": [5, 6], "max_new_tokens": 4}')
    unknown = sorted(k for k in obj if k not in JSONL_FIELDS)
    if unknown:
        raise _line_error(name, index, unknown[0], "unknown field",
                          f"a request has only the fields {', '.join(JSONL_FIELDS)}")

    if "prompt" not in obj:
        raise _line_error(name, index, "prompt", "missing",
                          "give the prompt as a list of token ids")
    prompt = obj["prompt"]
    if not isinstance(prompt, list) or not prompt:
        raise _line_error(name, index, "prompt", f"must be a non-empty list of token ids, not {prompt!r}",
                          "give the prompt as a list of integers, at least one")
    for pos, token in enumerate(prompt):
        if not isinstance(token, int) or isinstance(token, bool):
            raise _line_error(name, index, "prompt", f"token {pos} is {token!r}, not an integer",
                              "token ids are integers (already tokenized)")
        if not 0 <= token < vocab:
            raise _line_error(name, index, "prompt", f"token {pos} is {token}, outside [0, {vocab})",
                              f"the model's vocabulary has {vocab} ids; tokenize with its tokenizer")

    if "max_new_tokens" not in obj:
        raise _line_error(name, index, "max_new_tokens", "missing",
                          "say how many tokens to generate, at least 1")
    max_new = obj["max_new_tokens"]
    if not isinstance(max_new, int) or isinstance(max_new, bool) or max_new < 1:
        raise _line_error(name, index, "max_new_tokens", f"must be an integer >= 1, not {max_new!r}",
                          "say how many tokens to generate, at least 1")

    arrival = obj.get("arrival", 0.0)
    if (not isinstance(arrival, (int, float)) or isinstance(arrival, bool)
            or not math.isfinite(arrival) or arrival < 0):
        raise _line_error(name, index, "arrival",
                          f"must be a finite number of simulated seconds >= 0, not {arrival!r}",
                          "arrivals count from the start of the trace; drop the field for 0")

    req_id = obj.get("id", f"r{index}")
    if not isinstance(req_id, str) or not req_id:
        raise _line_error(name, index, "id", f"must be a non-empty string, not {req_id!r}",
                          "drop the field to get r<line index>")
    return Request(id=req_id, prompt=tuple(prompt), max_new_tokens=max_new, arrival=float(arrival))


__all__ = ["FIRST_TOKEN", "JSONL_FIELDS", "Request", "TraceSpec", "load_jsonl", "poisson_trace"]

"""Requests and traces: the seeded Poisson trace and the JSONL loader."""

import json
import math

import numpy as np
import pytest

from fornax.layers.errors import ConfigError
from fornax.serving.requests import Request, TraceSpec, load_jsonl, poisson_trace

VOCAB = 100


def test_trace_is_determined_by_its_seed():
    spec = TraceSpec(requests=40, rate=10.0, shared_prefix=4, seed=7)
    a = poisson_trace(spec, VOCAB)
    b = poisson_trace(spec, VOCAB)
    assert a == b
    c = poisson_trace(TraceSpec(requests=40, rate=10.0, shared_prefix=4, seed=8), VOCAB)
    assert [r.prompt for r in a] != [r.prompt for r in c]
    assert [r.arrival for r in a] != [r.arrival for r in c]


def test_trace_shape():
    spec = TraceSpec(requests=200, rate=25.0, prompt_len=(5, 9), output_len=(2, 3), shared_prefix=5, seed=1)
    trace = poisson_trace(spec, VOCAB)
    assert [r.id for r in trace] == [f"r{i}" for i in range(200)]
    arrivals = [r.arrival for r in trace]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0
    prefix = trace[0].prompt[:5]
    lengths = set()
    outs = set()
    for r in trace:
        assert r.prompt[:5] == prefix                 # every prompt starts with the shared tokens
        assert all(2 <= t < VOCAB and type(t) is int for t in r.prompt)
        assert 5 <= len(r.prompt) <= 9
        lengths.add(len(r.prompt))
        outs.add(r.max_new_tokens)
    assert lengths == {5, 6, 7, 8, 9}                 # the range is inclusive at both ends
    assert outs == {2, 3}
    # without a shared prefix the first tokens differ
    plain = poisson_trace(TraceSpec(requests=50, seed=1), VOCAB)
    assert len({r.prompt[:4] for r in plain}) > 40


def test_infinite_rate_sends_everything_at_once():
    trace = poisson_trace(TraceSpec(requests=10, rate=math.inf), VOCAB)
    assert [r.arrival for r in trace] == [0.0] * 10


@pytest.mark.parametrize("rate", [4.0, 50.0, 1000.0])
def test_poisson_gaps_are_exponential_with_mean_one_over_rate(rate):
    n = 5000
    trace = poisson_trace(TraceSpec(requests=n, rate=rate, seed=3), VOCAB)
    gaps = np.diff([r.arrival for r in trace])
    mean = 1.0 / rate
    # the sample mean of n-1 exponential gaps has standard deviation mean/sqrt(n-1): 5 sigma
    assert abs(gaps.mean() - mean) < 5 * mean / math.sqrt(n - 1)
    # exponential: standard deviation equals the mean, and P(gap > mean) = 1/e
    assert gaps.std() == pytest.approx(mean, rel=0.08)
    assert (gaps > mean).mean() == pytest.approx(math.exp(-1), abs=0.03)
    assert gaps.min() >= 0


@pytest.mark.parametrize("kwargs, field_name", [
    ({"requests": 0}, "requests"),
    ({"rate": 0.0}, "rate"),
    ({"rate": -1.0}, "rate"),
    ({"rate": math.nan}, "rate"),
    ({"prompt_len": (0, 4)}, "prompt_len"),
    ({"prompt_len": (9, 4)}, "prompt_len"),
    ({"output_len": (0, 0)}, "output_len"),
    ({"output_len": (3, 2)}, "output_len"),
    ({"shared_prefix": -1}, "shared_prefix"),
    ({"shared_prefix": 9, "prompt_len": (8, 48)}, "shared_prefix"),
])
def test_bad_trace_spec_names_the_field(kwargs, field_name):
    with pytest.raises(ConfigError) as err:
        poisson_trace(TraceSpec(**kwargs), VOCAB)
    assert field_name in err.value.message
    assert err.value.hint


def test_trace_needs_a_vocab_above_the_reserved_ids():
    with pytest.raises(ConfigError, match="vocab"):
        poisson_trace(TraceSpec(), 2)


def test_request_validates_itself():
    r = Request("a", [3, np.int64(4)], 2, 1)
    assert r.prompt == (3, 4) and all(type(t) is int for t in r.prompt) and r.arrival == 1.0
    for bad in ({"id": "", "prompt": (1,), "max_new_tokens": 1},
                {"id": "x", "prompt": (), "max_new_tokens": 1},
                {"id": "x", "prompt": (-1,), "max_new_tokens": 1},
                {"id": "x", "prompt": (1,), "max_new_tokens": 0},
                {"id": "x", "prompt": (1,), "max_new_tokens": 1, "arrival": -0.5},
                {"id": "x", "prompt": (1,), "max_new_tokens": 1, "arrival": math.inf}):
        with pytest.raises(ConfigError):
            Request(**bad)


# ---- JSONL -------------------------------------------------------------------------------


def write(tmp_path, lines):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_load_jsonl(tmp_path):
    path = write(tmp_path, [
        json.dumps({"prompt": [5, 6, 7], "max_new_tokens": 4, "arrival": 0.5, "id": "late"}),
        "",
        json.dumps({"prompt": [8], "max_new_tokens": 1}),
        "   ",
        json.dumps({"prompt": [0, 99], "max_new_tokens": 2, "arrival": 0}),
        json.dumps({"prompt": [9, 9], "max_new_tokens": 3, "arrival": 0.25}),
    ])
    trace = load_jsonl(path, VOCAB)
    # sorted by arrival, ties in file order; default ids are r<0-based line index>
    assert [r.id for r in trace] == ["r2", "r4", "r5", "late"]
    assert trace[0] == Request("r2", (8,), 1, 0.0)
    assert trace[1].prompt == (0, 99)
    assert trace[3].arrival == 0.5 and trace[3].max_new_tokens == 4
    assert load_jsonl(str(path), VOCAB) == trace


@pytest.mark.parametrize("bad_line, field_name", [
    ('{"prompt": [1, 2], "max_new_tokens": 3', None),                 # bad JSON
    ('[1, 2, 3]', None),                                               # not an object
    ('{"max_new_tokens": 3}', "prompt"),
    ('{"prompt": "hello", "max_new_tokens": 3}', "prompt"),
    ('{"prompt": [], "max_new_tokens": 3}', "prompt"),
    ('{"prompt": [1, 2.5], "max_new_tokens": 3}', "prompt"),
    ('{"prompt": [1, true], "max_new_tokens": 3}', "prompt"),
    ('{"prompt": [1, 100], "max_new_tokens": 3}', "prompt"),           # == vocab
    ('{"prompt": [-1], "max_new_tokens": 3}', "prompt"),
    ('{"prompt": [1]}', "max_new_tokens"),
    ('{"prompt": [1], "max_new_tokens": 0}', "max_new_tokens"),
    ('{"prompt": [1], "max_new_tokens": "3"}', "max_new_tokens"),
    ('{"prompt": [1], "max_new_tokens": 2.0}', "max_new_tokens"),
    ('{"prompt": [1], "max_new_tokens": 2, "arrival": -1}', "arrival"),
    ('{"prompt": [1], "max_new_tokens": 2, "arrival": "soon"}', "arrival"),
    ('{"prompt": [1], "max_new_tokens": 2, "id": 7}', "id"),
    ('{"prompt": [1], "max_new_tokens": 2, "id": ""}', "id"),
    ('{"prompt": [1], "max_new_tokens": 2, "id": "first"}', "id"),     # duplicate of line 1
    ('{"prompt": [1], "max_new_tokens": 2, "max_tokens": 5}', "max_tokens"),  # unknown field
])
def test_jsonl_errors_name_file_line_and_field(tmp_path, bad_line, field_name):
    path = write(tmp_path, [
        json.dumps({"prompt": [1, 2], "max_new_tokens": 2, "id": "first"}),
        "",
        bad_line,                                                      # line 3
        json.dumps({"prompt": [3], "max_new_tokens": 2}),
    ])
    with pytest.raises(ConfigError) as err:
        load_jsonl(path, VOCAB)
    message = err.value.message
    assert str(path) in message
    assert "line 3" in message
    if field_name is not None:
        assert f"field '{field_name}'" in message
    assert err.value.hint


def test_jsonl_duplicate_default_id_is_caught(tmp_path):
    # an explicit id may collide with another line's default one
    path = write(tmp_path, [json.dumps({"prompt": [1], "max_new_tokens": 1, "id": "r1"}),
                            json.dumps({"prompt": [2], "max_new_tokens": 1})])
    with pytest.raises(ConfigError, match=r"line 2, field 'id'.*first on line 1"):
        load_jsonl(path, VOCAB)


def test_jsonl_empty_or_missing_file(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n")
    with pytest.raises(ConfigError) as err:
        load_jsonl(empty, VOCAB)
    assert str(empty) in err.value.message and err.value.hint
    with pytest.raises(ConfigError) as err:
        load_jsonl(tmp_path / "nope.jsonl", VOCAB)
    assert "nope.jsonl" in err.value.message and err.value.hint

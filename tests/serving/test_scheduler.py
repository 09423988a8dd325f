"""Continuous batching: token budget, chunked prefill, decode priority, preemption.

Runs are driven by a fake model that computes each sampled token from the K/V contents the
step reads (a model of the device blocks, written by each item, copied by the step's swap
lists), so a scheduler or block-manager mistake — a wrong block, a lost swap, a shared block
overwritten — changes the generated tokens.  Every run is compared with the tokens the model
generates for each request alone.
"""

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fornax.layers.errors import ConfigError
from fornax.serving.blocks import BlockManager
from fornax.serving.requests import Request, TraceSpec, poisson_trace
from fornax.serving.scheduler import Scheduler, SchedulerConfig, Step
from fornax.serving.sequence import Sequence

VOCAB = 50


def model(context):
    """The fake model: the next token from every token before it (order matters)."""
    return sum((i + 1) * t for i, t in enumerate(context)) % VOCAB


def reference(request):
    """What the model generates for ``request`` alone."""
    tokens = list(request.prompt)
    for _ in range(request.max_new_tokens):
        tokens.append(model(tokens))
    return tokens[len(request.prompt):]


@dataclass
class Run:
    scheduler: Scheduler
    finished: dict = field(default_factory=dict)
    steps: list = field(default_factory=list)     # (items as (id, start, n, samples), step)


def drive(requests, config, num_blocks, block_size, *, host=0, caching=True, max_steps=5000):
    """Run ``requests`` to completion like an engine: arrivals by simulated time, swaps before
    each step, K/V written by each item, the token sampled from what the step reads."""
    blocks = BlockManager(num_blocks, block_size, prefix_caching=caching, num_host_blocks=host)
    sched = Scheduler(config, blocks)
    run = Run(sched)
    device = {}
    host_mem = {}
    pending = sorted(requests, key=lambda r: r.arrival)
    now = 0.0
    while pending or sched.has_unfinished():
        while pending and pending[0].arrival <= now:
            sched.add(pending.pop(0))
        if not sched.has_unfinished():
            now = pending[0].arrival
            continue
        assert len(run.steps) < max_steps, "no progress"
        step = sched.schedule()
        check_step(step, sched, config)
        for d, h in step.swap_out:
            host_mem[h] = list(device[d])
        for h, d in step.swap_in:
            device[d] = list(host_mem[h])
        for seq, n in step.items:                 # every write of the step, then every read
            for p in range(seq.num_computed, seq.num_computed + n):
                block = device.setdefault(seq.block_table[p // block_size], [None] * block_size)
                block[p % block_size] = seq.tokens[p]
        sampled = {}
        for seq, n in step.items:
            if step.samples(seq, n):
                context = [device[seq.block_table[p // block_size]][p % block_size]
                           for p in range(seq.num_tokens)]
                assert context == seq.tokens, f"{seq.id} reads K/V that are not its own"
                sampled[seq.id] = model(context)
        run.steps.append(([(s.id, s.num_computed, n, step.samples(s, n)) for s, n in step.items], step))
        now += 0.001 + 1e-5 * step.num_tokens
        for seq in sched.finish_step(step, sampled, now):
            assert seq.id not in run.finished
            run.finished[seq.id] = seq
    return run


def check_step(step, sched, config):
    assert step.num_tokens <= config.max_batched_tokens
    assert len(step.items) <= config.max_num_seqs
    assert len(sched.running) <= config.max_num_seqs
    ids = [s.id for s, _ in step.items]
    assert len(ids) == len(set(ids))
    for seq, n in step.items:
        assert n >= 1 and seq.num_computed + n <= seq.num_tokens
        assert seq.status == "running" and seq in sched.running
        assert len(seq.block_table) * sched.blocks.block_size >= seq.num_computed + n
        if not config.chunked_prefill:
            assert seq.num_computed + n == seq.num_tokens      # never a partial prompt
    for seq in step.preempted:
        assert seq.status in ("waiting", "swapped") and seq not in sched.running
    assert len({h for _, h in step.swap_out}) == len(step.swap_out)
    assert len({d for _, d in step.swap_in}) == len(step.swap_in)


def check_outputs(run, requests):
    assert set(run.finished) == {r.id for r in requests}
    for r in requests:
        seq = run.finished[r.id]
        assert seq.status == "finished" and seq.block_table == [] and seq.host_blocks == []
        assert seq.generated == reference(r), r.id
        assert len(seq.token_times) == r.max_new_tokens
        assert seq.first_token_at == seq.token_times[0] and seq.finished_at == seq.token_times[-1]
        assert seq.token_times == sorted(seq.token_times)
        assert seq.first_token_at > r.arrival
    assert run.scheduler.blocks.used_blocks == 0
    assert run.scheduler.blocks.free_host_blocks == run.scheduler.blocks.num_host_blocks
    assert not run.scheduler.has_unfinished()


def req(name, prompt_len, max_new, start=10, arrival=0.0):
    return Request(name, tuple(range(start, start + prompt_len)), max_new, arrival)


# ---- configuration -------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [{"max_num_seqs": 0}, {"max_batched_tokens": 0},
                                    {"max_num_seqs": 2.5}, {"preemption": "drop"},
                                    {"chunked_prefill": "yes"}])
def test_bad_config(kwargs):
    with pytest.raises(ConfigError) as err:
        SchedulerConfig(**kwargs)
    assert err.value.hint


def test_duplicate_request_id():
    sched = Scheduler(SchedulerConfig(), BlockManager(8, 4))
    sched.add(req("a", 3, 1))
    with pytest.raises(ConfigError, match="'a'"):
        sched.add(req("a", 4, 1))


def test_a_request_that_can_never_fit_is_an_error_of_schedule():
    sched = Scheduler(SchedulerConfig(), BlockManager(num_blocks=3, block_size=4))
    sched.add(req("ok", 4, 2))
    seq = sched.add(req("big", 6, 8))             # 6 + 8 - 1 = 13 tokens: 4 blocks > 3
    assert seq.status == "waiting"
    with pytest.raises(ConfigError) as err:
        sched.schedule()
    message = err.value.message
    assert "big" in message and "13 tokens" in message and "3 blocks" in message and "12 tokens" in message
    assert "more blocks" in err.value.hint and "shorter" in err.value.hint
    assert sched.running == [] and sched.blocks.used_blocks == 0   # raised before changing anything


def test_a_request_that_fits_exactly_is_not_an_error():
    run = drive([req("edge", 6, 7)], SchedulerConfig(), num_blocks=3, block_size=4)   # 12 tokens
    check_outputs(run, [req("edge", 6, 7)])


def test_without_chunked_prefill_a_prompt_over_the_budget_is_an_error():
    sched = Scheduler(SchedulerConfig(max_batched_tokens=16, chunked_prefill=False), BlockManager(64, 4))
    sched.add(req("long", 17, 1))
    with pytest.raises(ConfigError, match="long.*17 tokens.*max_batched_tokens is 16") as err:
        sched.schedule()
    assert "chunked prefill" in err.value.hint


# ---- batching ------------------------------------------------------------------------------


def test_chunked_prefill_splits_a_long_prompt_and_only_the_last_chunk_samples():
    requests = [req("long", 100, 3)]
    run = drive(requests, SchedulerConfig(max_batched_tokens=32), num_blocks=64, block_size=4)
    assert [items for items, _ in run.steps] == [
        [("long", 0, 32, False)], [("long", 32, 32, False)], [("long", 64, 32, False)],
        [("long", 96, 4, True)], [("long", 100, 1, True)], [("long", 101, 1, True)]]
    check_outputs(run, requests)
    counts = run.scheduler.counts()
    assert counts["prefill_tokens"] == 100 and counts["decode_tokens"] == 2 and counts["steps"] == 6


def test_without_chunked_prefill_a_prompt_waits_for_a_whole_budget():
    requests = [req("a", 60, 2), req("b", 60, 2, start=200)]
    chunked = drive(requests, SchedulerConfig(max_batched_tokens=100), num_blocks=64, block_size=4)
    assert chunked.steps[0][0] == [("a", 0, 60, True), ("b", 0, 40, False)]
    whole = drive(requests, SchedulerConfig(max_batched_tokens=100, chunked_prefill=False),
                  num_blocks=64, block_size=4)
    assert whole.steps[0][0] == [("a", 0, 60, True)]
    assert whole.steps[1][0] == [("a", 60, 1, True), ("b", 0, 60, True)]
    check_outputs(chunked, requests)
    check_outputs(whole, requests)


def test_admission_is_first_come_first_served():
    # b does not fit the budget whole; c would, but does not overtake b
    requests = [req("a", 50, 3), req("b", 60, 1, start=100), req("c", 5, 1, start=300)]
    run = drive(requests, SchedulerConfig(max_batched_tokens=64, chunked_prefill=False),
                num_blocks=64, block_size=4)
    assert run.steps[0][0] == [("a", 0, 50, True)]
    assert run.steps[1][0] == [("a", 50, 1, True), ("b", 0, 60, True)]
    assert run.steps[2][0] == [("a", 51, 1, True), ("c", 0, 5, True)]
    check_outputs(run, requests)


def test_decodes_are_scheduled_before_new_prefills():
    requests = [req("first", 4, 10), req("second", 40, 2, start=100, arrival=0.0005)]
    run = drive(requests, SchedulerConfig(max_batched_tokens=16), num_blocks=64, block_size=4)
    assert run.steps[0][0] == [("first", 0, 4, True)]
    # second arrived during step 0: it gets what the decode leaves of the budget
    assert run.steps[1][0] == [("first", 4, 1, True), ("second", 0, 15, False)]
    assert run.steps[2][0] == [("first", 5, 1, True), ("second", 15, 15, False)]
    for items, _ in run.steps:
        if len(items) == 2:
            assert items[0][0] == "first"
    check_outputs(run, requests)


def test_max_num_seqs_is_respected():
    requests = [req(f"r{i}", 3 + i, 4, start=10 * i) for i in range(10)]
    config = SchedulerConfig(max_num_seqs=3)
    run = drive(requests, config, num_blocks=64, block_size=4)
    assert max(len(items) for items, _ in run.steps) == 3
    assert run.steps[0][0] == [("r0", 0, 3, True), ("r1", 0, 4, True), ("r2", 0, 5, True)]
    check_outputs(run, requests)


def test_token_budget_is_respected_on_a_busy_trace():
    requests = poisson_trace(TraceSpec(requests=40, rate=2000.0, prompt_len=(8, 40), output_len=(2, 12),
                                       seed=5), VOCAB)
    config = SchedulerConfig(max_num_seqs=8, max_batched_tokens=48)
    run = drive(requests, config, num_blocks=128, block_size=4)
    assert max(step.num_tokens for _, step in run.steps) == 48   # it does fill the budget
    check_outputs(run, requests)


# ---- preemption ------------------------------------------------------------------------------


def two_in_a_tiny_cache(preemption, host=0):
    """A and B (3-token prompts, 4 new tokens) in 4 blocks of 2: both fit until A's third
    decode needs a fifth block."""
    blocks = BlockManager(num_blocks=4, block_size=2, num_host_blocks=host)
    sched = Scheduler(SchedulerConfig(preemption=preemption), blocks)
    a = sched.add(Request("A", (5, 6, 7), 4))
    b = sched.add(Request("B", (8, 9, 10), 4))

    def step_and_finish(now):
        step = sched.schedule()
        sampled = {s.id: model(s.tokens) for s, n in step.items if step.samples(s, n)}
        return step, sched.finish_step(step, sampled, now)

    return sched, a, b, step_and_finish


def test_recompute_preempts_the_last_running_sequence():
    sched, a, b, step_and_finish = two_in_a_tiny_cache("recompute")
    step, _ = step_and_finish(1.0)
    assert [(s.id, n) for s, n in step.items] == [("A", 3), ("B", 3)]
    step_and_finish(2.0)
    assert b.generated == reference(b.request)[:2] and b.first_token_at == 1.0
    step, _ = step_and_finish(3.0)
    assert step.preempted == [b] and [(s.id, n) for s, n in step.items] == [("A", 1)]
    assert b.status == "waiting" and sched.waiting[0] is b and sched.running == [a]
    assert b.num_computed == 0 and b.block_table == [] and b.preemptions == 1
    assert b.generated == reference(b.request)[:2]            # generated tokens are kept
    assert sched.counts()["preemptions"] == 1 and sched.counts()["swaps"] == 0
    step, finished = step_and_finish(4.0)                     # B does not fit yet
    assert [(s.id, n) for s, n in step.items] == [("A", 1)] and finished == [a]
    step, _ = step_and_finish(5.0)
    # B is prefilled again, prompt and generated tokens, its first block from the prefix cache
    assert [(s.id, n) for s, n in step.items] == [("B", 3)]
    assert b.prefix_hit_tokens == 2 and sched.counts()["prefix_hit_tokens"] == 2
    assert b.generated == reference(b.request)[:3]
    assert b.first_token_at == 1.0 and b.token_times == [1.0, 2.0, 5.0]
    step, finished = step_and_finish(6.0)
    assert finished == [b] and b.generated == reference(b.request)
    assert not sched.has_unfinished()


def test_swap_preempts_the_last_running_sequence():
    sched, a, b, step_and_finish = two_in_a_tiny_cache("swap", host=4)
    step_and_finish(1.0)
    step_and_finish(2.0)
    table = list(b.block_table)
    step, _ = step_and_finish(3.0)
    assert step.preempted == [b] and step.swap_out == list(zip(table, [0, 1]))
    assert b.status == "swapped" and list(sched.swapped) == [b] and b.host_blocks == [0, 1]
    assert b.num_computed == 4                                # its K/V live on in host memory
    assert sched.counts()["swaps"] == 1 and sched.counts()["preemptions"] == 0
    step, finished = step_and_finish(4.0)
    assert step.swap_in == [] and finished == [a]
    step, _ = step_and_finish(5.0)
    assert [h for h, _ in step.swap_in] == [0, 1] and [d for _, d in step.swap_in] == b.block_table[:2]
    assert [(s.id, n) for s, n in step.items] == [("B", 1)] and step.is_decode(b, 0) is False
    assert b.status == "running" and b.host_blocks == []
    step_and_finish(6.0)
    assert b.generated == reference(b.request) and b.status == "finished"


def test_recompute_puts_the_preempted_at_the_front_of_waiting():
    sched, a, b, step_and_finish = two_in_a_tiny_cache("recompute")
    step_and_finish(1.0)
    step_and_finish(2.0)
    c = sched.add(Request("C", (11, 12), 2))
    step, _ = step_and_finish(3.0)
    assert step.preempted == [b] and list(sched.waiting) == [b, c]
    while sched.has_unfinished():
        step_and_finish(10.0)
    for s in (a, b, c):
        assert s.generated == reference(s.request)


def test_waiting_sequences_are_not_admitted_while_one_is_swapped_out():
    sched, a, b, step_and_finish = two_in_a_tiny_cache("swap", host=4)
    step_and_finish(1.0)
    step_and_finish(2.0)
    step_and_finish(3.0)
    assert b.status == "swapped" and a.status == "running"
    c = sched.add(Request("C", (11,), 1))                     # would fit the one free block
    step, _ = step_and_finish(4.0)
    assert [(s.id, n) for s, n in step.items] == [("A", 1)] and c.status == "waiting"
    step, _ = step_and_finish(5.0)                            # B first, then C
    assert [(s.id, n) for s, n in step.items] == [("B", 1), ("C", 1)]
    assert step.swap_in and c.status == "finished"


def test_swap_without_host_room_falls_back_to_recompute():
    sched, a, b, step_and_finish = two_in_a_tiny_cache("swap", host=1)
    step_and_finish(1.0)
    step_and_finish(2.0)
    step, _ = step_and_finish(3.0)
    assert [(s.id, n) for s, n in step.items] == [("A", 1)] and a.status == "running"
    assert step.preempted == [b] and step.swap_out == [] and b.status == "waiting"
    assert sched.counts()["preemptions"] == 1 and sched.counts()["swaps"] == 0


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_the_only_running_sequence_is_preempted_when_it_cannot_grow(preemption):
    blocks = BlockManager(num_blocks=3, block_size=2, num_host_blocks=4)
    sched = Scheduler(SchedulerConfig(preemption=preemption), blocks)
    a = sched.add(Request("A", (5, 6, 7), 3))               # 3 + 3 - 1 = 5 tokens: 3 blocks

    def step_and_finish(now):
        step = sched.schedule()
        sampled = {s.id: model(s.tokens) for s, n in step.items if step.samples(s, n)}
        sched.finish_step(step, sampled, now)
        return step

    step_and_finish(1.0)
    outsider = Sequence(Request("X", (1, 1), 1))            # something else holds the third block
    assert blocks.allocate(outsider, 2)
    assert [(s.id, n) for s, n in step_and_finish(2.0).items] == [("A", 1)]
    step = step_and_finish(3.0)                             # A needs a third block: none is free
    assert step.items == [] and step.preempted == [a] and sched.running == []
    assert a.status == ("waiting" if preemption == "recompute" else "swapped")
    assert step_and_finish(4.0).items == []                 # still no room
    blocks.free(outsider)
    step = step_and_finish(5.0)
    assert [(s.id, n) for s, n in step.items] == [("A", 1)]  # all but the last token found again
    assert a.status == "finished" and a.generated == reference(a.request)
    if preemption == "swap":
        assert len(step.swap_in) == 2
    else:
        assert a.prefix_hit_tokens == 4


SCENARIOS = {
    "recompute": {"preemption": "recompute", "host": 0},
    "swap": {"preemption": "swap", "host": 64},
    "swap-small-host": {"preemption": "swap", "host": 3},
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("chunked", [True, False])
@pytest.mark.parametrize("caching", [True, False])
def test_a_tiny_cache_preempts_yet_every_request_finishes_with_the_same_tokens(scenario, chunked, caching):
    spec = TraceSpec(requests=24, rate=400.0, prompt_len=(6, 20), output_len=(4, 14), shared_prefix=6, seed=11)
    requests = poisson_trace(spec, VOCAB)
    params = SCENARIOS[scenario]
    config = SchedulerConfig(max_num_seqs=8, max_batched_tokens=40, chunked_prefill=chunked,
                             preemption=params["preemption"])
    big = drive(requests, config, num_blocks=512, block_size=4, caching=caching)
    counts = big.scheduler.counts()
    assert counts["preemptions"] == 0 and counts["swaps"] == 0
    tiny = drive(requests, config, num_blocks=10, block_size=4, host=params["host"], caching=caching)
    counts = tiny.scheduler.counts()
    if scenario == "recompute":
        assert counts["preemptions"] > 0 and counts["swaps"] == 0
    elif scenario == "swap":
        assert counts["swaps"] > 0 and counts["preemptions"] == 0
        assert any(step.swap_in for _, step in tiny.steps)
    else:
        assert counts["swaps"] > 0 and counts["preemptions"] > 0
    check_outputs(big, requests)
    check_outputs(tiny, requests)
    for r in requests:
        assert tiny.finished[r.id].generated == big.finished[r.id].generated
    assert sum(s.preemptions for s in tiny.finished.values()) == counts["preemptions"] + counts["swaps"]
    if caching:
        assert big.scheduler.counts()["prefix_hit_tokens"] > 0
    else:
        assert counts["prefix_hit_tokens"] == 0


def test_prefix_hits_are_counted_per_admission():
    shared = tuple(range(10, 18))
    requests = [Request("a", shared + (1, 2), 2), Request("b", shared + (3,), 2, arrival=1.0)]
    run = drive(requests, SchedulerConfig(), num_blocks=16, block_size=4)
    assert run.finished["a"].prefix_hit_tokens == 0
    assert run.finished["b"].prefix_hit_tokens == 8
    assert run.scheduler.counts()["prefix_hit_tokens"] == 8
    assert run.scheduler.blocks.counts()["prefix_hit_tokens"] == 8
    check_outputs(run, requests)


def test_step_helpers():
    step = Step()
    assert step.num_tokens == 0 and step.items == [] and step.swap_out == [] and step.preempted == []
    sched = Scheduler(SchedulerConfig(), BlockManager(8, 4))
    s = sched.add(req("a", 5, 3))
    step = sched.schedule()
    assert step.items == [(s, 5)] and step.num_tokens == 5 and step.samples(s, 5)
    assert not step.samples(s, 4) and not step.is_decode(s, 5)
    sched.finish_step(step, {"a": 7}, 0.5)
    step = sched.schedule()
    assert step.items == [(s, 1)] and step.is_decode(s, 1) and step.samples(s, 1)
    with pytest.raises(KeyError, match="a"):
        sched.finish_step(step, {}, 1.0)


def test_decode_and_prefill_tokens_are_told_apart():
    # a one-token prompt and one-token prefill chunks are prefill work, not decodes
    requests = [Request("one", (9,), 2), Request("chunky", (4, 5, 6), 2)]
    run = drive(requests, SchedulerConfig(max_batched_tokens=2), num_blocks=16, block_size=4)
    assert run.steps[0][0] == [("one", 0, 1, True), ("chunky", 0, 1, False)]
    step = run.steps[0][1]
    assert run.scheduler.counts() == {"steps": len(run.steps), "preemptions": 0, "swaps": 0,
                                      "prefill_tokens": 4, "decode_tokens": 2, "prefix_hit_tokens": 0}
    assert step.num_seqs == 2


# ---- property: any small configuration finishes every request with the right tokens ------------


@st.composite
def workloads(draw):
    block_size = draw(st.integers(1, 4))
    prefixes = [(), (3, 4, 5, 6), (3, 4, 5, 6, 7, 8, 9)]
    requests = []
    for i in range(draw(st.integers(1, 8))):
        prefix = draw(st.sampled_from(prefixes))
        tail = draw(st.lists(st.integers(2, 6), min_size=1, max_size=10))
        requests.append(Request(f"q{i}", prefix + tuple(tail), draw(st.integers(1, 6)),
                                draw(st.sampled_from([0.0, 0.0, 0.001, 0.003]))))
    longest = max(len(r.prompt) + r.max_new_tokens - 1 for r in requests)
    chunked = draw(st.booleans())
    budget = draw(st.integers(1, 24))
    if not chunked:
        budget = max(budget, longest)     # a recomputed sequence prefills everything at once
    config = SchedulerConfig(max_num_seqs=draw(st.integers(1, 5)), max_batched_tokens=budget,
                             chunked_prefill=chunked, preemption=draw(st.sampled_from(["recompute", "swap"])))
    num_blocks = -(-longest // block_size) + draw(st.sampled_from([0, 0, 1, 2, 4]))   # tight: preemptions
    return requests, config, num_blocks, block_size, draw(st.integers(0, 8)), draw(st.booleans())


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_any_small_configuration_finishes_every_request(workload):
    requests, config, num_blocks, block_size, host, caching = workload
    run = drive(requests, config, num_blocks, block_size, host=host, caching=caching)
    check_outputs(run, requests)
    counts = run.scheduler.counts()
    computed = sum(n for items, _ in run.steps for _, _, n, _ in items)
    assert counts["prefill_tokens"] + counts["decode_tokens"] == computed

"""``make fuzz``'s targets with a small fixed budget: every parser and loader a user can feed
returns or raises its documented fornax error for random and mutated inputs."""

from __future__ import annotations

import pytest

from fornax.fuzz import loaders as fuzz

TARGETS = {t.name: t for t in fuzz.targets()}


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_fuzz_target_holds_on_a_fixed_budget(name):
    outcome = fuzz.run_target(TARGETS[name], fuzz.t_cases(TARGETS[name], 150), seed=1)
    assert outcome.cases >= 15
    assert outcome.failures == []


def test_the_fuzzer_finds_what_the_property_forbids():
    """A loader that raises an undocumented exception is reported with the input."""
    def loader(data):
        if len(data) > 3:
            raise KeyError("oops")
    t = fuzz.Target("broken", lambda: fuzz._mutations(b"abcdefgh"), loader, (ValueError,))
    outcome = fuzz.run_target(t, 50)
    assert outcome.failures and outcome.failures[0].startswith("KeyError")

"""The torch suite's deterministic sample on cuda-like (see tests/torch_sample.py)."""

from torch_sample import check_sample


def test_the_sample_matches_cpu_or_the_known_failure_table():
    check_sample("cuda-like")

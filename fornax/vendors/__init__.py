"""The vendor families: cuda_like, rocm_like, xpu_like and the null template, each a package
with the same file names; and :func:`load_facts`, which reads and checks a family's
``vendor.toml`` for built-in and third-party families alike."""

from .facts_loader import check_facts, load_facts

__all__ = ["check_facts", "load_facts"]

"""A continuous-batching LLM serving runtime on the simulated device, modelled on vLLM.

The pure-Python core decides *what* runs; nothing in it touches the device:

* :mod:`fornax.serving.requests` — a :class:`~fornax.serving.requests.Request` (prompt token
  ids, how many tokens to generate, when it arrives) and the two ways to get a trace of them:
  a seeded Poisson arrival process (:func:`~fornax.serving.requests.poisson_trace`) or a JSONL
  file (:func:`~fornax.serving.requests.load_jsonl`).
* :mod:`fornax.serving.sequence` — a :class:`~fornax.serving.sequence.Sequence`: one request's
  state in the engine (its tokens so far, how many have K/V in the cache, its KV block table,
  its status and timings).
* :mod:`fornax.serving.blocks` — the :class:`~fornax.serving.blocks.BlockManager`: the paged KV
  cache's block pool with reference-counted sharing, automatic prefix caching (full blocks
  found again by a hash chain of their tokens, evicted least recently freed first) and a host
  swap space.
* :mod:`fornax.serving.scheduler` — the :class:`~fornax.serving.scheduler.Scheduler`:
  continuous batching under a token budget, with chunked prefill, decodes before new
  prefills, and preemption (recompute or swap) of the lowest-priority sequence when KV blocks
  run out.

On top of it, the parts that run on the device and report:

* :mod:`fornax.serving.models` — the decoders served (``transformers`` Llama and GPT-2 from
  small configurations, seeded).
* :mod:`fornax.serving.runner` — :class:`~fornax.serving.runner.PagedModel`: a step of the
  model on ``torch.device("fornax")``, attention through the library seam's
  ``paged_cache_write`` and ``paged_attention``.
* :mod:`fornax.serving.graph_model` — :class:`~fornax.serving.graph_model.GraphPagedModel`:
  fornax's own graph decoder, the same Llama as whole graphs compiled by the stack.
* :mod:`fornax.serving.engine` — :func:`~fornax.serving.engine.serve`: arrivals, steps and the
  simulated clock.
* :mod:`fornax.serving.metrics` — the ``fornax.serve/1`` report; :mod:`fornax.serving.capacity`
  — how many sequences fit in a chip's HBM; :mod:`fornax.serving.plot` — latency vs load.
"""

from .blocks import BlockManager
from .capacity import REFERENCE_SHAPES, Capacity, capacity
from .engine import Engine, ServeConfig, ServeResult, serve
from .graph_model import GraphPagedModel
from .metrics import capacity_rows, document, latencies, render
from .models import DecoderShape, build, shape_of
from .plot import plot_load
from .requests import Request, TraceSpec, load_jsonl, poisson_trace
from .scheduler import Scheduler, SchedulerConfig, Step
from .sequence import Sequence

__all__ = ["REFERENCE_SHAPES", "BlockManager", "Capacity", "DecoderShape", "Engine", "GraphPagedModel", "Request",
           "Scheduler", "SchedulerConfig", "Sequence", "ServeConfig", "ServeResult", "Step", "TraceSpec",
           "build", "capacity", "capacity_rows", "document", "latencies", "load_jsonl", "plot_load",
           "poisson_trace", "render", "serve", "shape_of"]

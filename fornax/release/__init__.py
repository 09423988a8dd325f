"""The regression and release system: pinned baselines of reports compared metric by metric
(:mod:`~fornax.release.baseline`, over the runs of a :mod:`~fornax.release.plan` matrix, with
the metrics of :mod:`~fornax.release.metrics`, rendered as a page by
:mod:`~fornax.release.html`), and the ecosystem matrix of qualification levels read from
stored evidence (:mod:`~fornax.release.ecosystem`).  See docs/regression.md and
docs/compatibility.md."""

"""Evaluation: the protocols (full ranking and the sampled uni100 / pop100) over a `Scorer`, the
metrics, and the papers' published rows. It scores through the `Scorer` protocol and never
imports a model."""

"""The generation family (Tables 1, 3, 4, Appendices E–H): ``config`` (presets, the run context), ``data`` (image
and text sets), ``training`` (models, training a cell), ``scoring`` (the @Top-50 metrics), ``shared`` (the tables'
CLI, plan and report helpers), one module per table or appendix, and ``metric_figures`` (App. F–H's figures)."""

from .. import forward_old_module

__getattr__ = forward_old_module(__name__)  # the old module attention_zoo.experiments.generation (now .training)

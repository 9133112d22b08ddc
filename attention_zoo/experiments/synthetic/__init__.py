"""The synthetic family (Appendix I, Figures 12–13): ``sweep`` (presets, cells, the experiment), ``fit`` (the model
and its grouped training), ``report`` (tables, figures, verdicts) and ``train_speed`` (the training-throughput
benchmark on the sweeps' model, ``python -m attention_zoo.bench train``)."""

from .. import forward_old_module

__getattr__ = forward_old_module(__name__)  # the old module attention_zoo.experiments.synthetic (now .sweep)

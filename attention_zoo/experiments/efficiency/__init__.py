"""The efficiency family (Tables 2 and 7, the RowSum analysis): ``timing`` (the timing and memory options and the
measuring loop both tables share), ``paper_flops`` (the authors' MAC model), one module per table and its report."""

from .. import forward_old_module

__getattr__ = forward_old_module(__name__)  # the old module attention_zoo.experiments.efficiency (now .timing)

"""``python -m attention_zoo.experiments.synthetic``: the path of the old flat module, now a package (see
``attention_zoo.experiments.run_moved``)."""

import sys

from .. import run_moved

sys.exit(run_moved("synthetic"))

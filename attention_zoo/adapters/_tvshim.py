"""Make torchvision importable beside the CPU build of torch.

PyPI only serves a CUDA-linked torchvision 0.28.0; its ``_C`` library cannot load next to CPU torch,
and ``import torchvision`` then dies registering fake kernels for ``nms``/``qnms``. torch-fidelity and
transformers (hence bert-score) import torchvision, so we declare those two op schemas first.
Inert where torchvision's own ops load (the library registers the real schemas itself).
Import this module before anything that may import torchvision.
"""

import glob
import importlib.util
import os

import torch

_SCHEMA = "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"


def _ops_loadable(pkg_dir: str) -> bool:
    libs = glob.glob(os.path.join(pkg_dir, "_C*.so"))
    if not libs:
        return False
    try:
        torch.ops.load_library(libs[0])
    except (OSError, RuntimeError):
        return False
    return True


def apply() -> bool:
    """Declare the missing schemas if torchvision's ops cannot load. Returns True if the shim was applied."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return False
    if _ops_loadable(spec.submodule_search_locations[0]):
        return False
    lib = torch.library.Library("torchvision", "FRAGMENT")
    for op in ("nms", "qnms"):
        try:
            lib.define(f"{op}{_SCHEMA}")
        except RuntimeError:  # already defined (shim applied twice, or ops partly loaded)
            pass
    _LIBS.append(lib)  # a Library deregisters its definitions when garbage-collected
    return True


_LIBS: list = []
APPLIED = apply()

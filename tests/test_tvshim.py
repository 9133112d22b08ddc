"""The torchvision import shim: needed with CPU torch + PyPI's CUDA torchvision, inert where the ops load."""

import importlib.util
import os
import subprocess
import sys

import torch

from attention_zoo import _tvshim


def test_torchvision_and_dependents_import_after_the_shim():
    import torch_fidelity  # noqa: F401  (imports torchvision at module level)
    import torchvision
    from torchvision.transforms import functional as TF

    img = torch.rand(3, 8, 8)
    assert TF.resize(img, [4, 4], antialias=True).shape == (3, 4, 4)
    assert torchvision.__version__.startswith("0.28")


def test_shim_is_inert_where_the_ops_library_loads(monkeypatch):
    torch_dir = os.path.dirname(torch.__file__)
    assert _tvshim._ops_loadable(torch_dir)  # a loadable _C*.so: the real ops would register themselves
    spec = importlib.util.find_spec("torch")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)
    assert _tvshim.apply() is False


def test_shim_reports_whether_it_was_needed():
    tv_dir = importlib.util.find_spec("torchvision").submodule_search_locations[0]
    needed = not _tvshim._ops_loadable(tv_dir)
    assert _tvshim.APPLIED is needed
    # Without the shim, a CUDA-built torchvision beside CPU torch fails to import; with it, it imports.
    bare = subprocess.run([sys.executable, "-c", "import torchvision"], capture_output=True, text=True)
    assert (bare.returncode != 0) is needed, bare.stderr[-300:]
    shimmed = subprocess.run([sys.executable, "-c", "import attention_zoo, torchvision"], capture_output=True,
                             text=True)
    assert shimmed.returncode == 0, shimmed.stderr[-300:]


def test_no_ops_library_means_not_loadable(tmp_path):
    assert not _tvshim._ops_loadable(str(tmp_path))

"""The torchvision import shim: needed with CPU torch + PyPI's CUDA torchvision, inert where the ops load."""

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from attention_zoo.adapters import _tvhook, _tvshim


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
    bare = subprocess.run([sys.executable, "-c", "import torchvision"], capture_output=True, text=True,
                          env={**os.environ, "ATTENTION_ZOO_TVSHIM": "0"})  # without the start-up hook
    assert (bare.returncode != 0) is needed, bare.stderr[-300:]
    shimmed = subprocess.run([sys.executable, "-c", "import attention_zoo, torchvision"], capture_output=True,
                             text=True)
    assert shimmed.returncode == 0, shimmed.stderr[-300:]


def test_no_ops_library_means_not_loadable(tmp_path):
    assert not _tvshim._ops_loadable(str(tmp_path))


@pytest.mark.parametrize("first", ["timm", "torchvision"])
def test_importing_timm_or_torchvision_before_attention_zoo(tmp_path, first):
    """The start-up hook (attention_zoo._tvhook, a .pth line) applies the shim before torchvision's own import."""
    pytest.importorskip(first)
    assert _tvhook.main(["--install", "--site-dir", str(tmp_path)]) == 0
    code = f"import site; site.addsitedir({str(tmp_path)!r}); import {first}; import attention_zoo; print('ok')"
    env = {**os.environ, "ATTENTION_ZOO_TVSHIM": "1"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-500:]
    # The hook imports nothing until torchvision is imported, and runs the shim once.
    probe = (f"import site, sys; site.addsitedir({str(tmp_path)!r}); heavy = 'torch' in sys.modules; "
             "import torchvision, attention_zoo; from attention_zoo.adapters import _tvshim; "
             "print(heavy, sys.modules['attention_zoo.adapters._tvshim'] is _tvshim)")
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    assert run.returncode == 0 and run.stdout.split()[-2:] == ["False", "True"], run.stderr[-500:]
    assert _tvhook.main(["--uninstall", "--site-dir", str(tmp_path)]) == 0
    assert not (tmp_path / _tvhook.PTH_NAME).exists()


def test_hook_is_off_by_environment(monkeypatch):
    monkeypatch.setenv("ATTENTION_ZOO_TVSHIM", "0")
    assert _tvhook.install() is False
    assert _tvhook.TorchvisionShimFinder not in sys.meta_path

"""Apply the torchvision shim (``_tvshim``) even when torchvision is imported before attention_zoo.

``import timm`` (or ``import torchvision``) before ``import attention_zoo`` crashes with ``torchvision::nms does not
exist`` where PyPI's CUDA-built torchvision sits beside CPU torch: the failure happens inside torchvision's own
import, before any of our code runs. Only code that runs at interpreter start can prevent it, so
``python -m attention_zoo.adapters._tvhook --install`` writes a one-line ``attention_zoo_tvshim.pth`` into site-packages
(tox does this; ``--uninstall`` removes it). At start-up that line installs ``TorchvisionShimFinder``, a meta-path
finder that costs nothing until something imports ``torchvision``; it then loads ``_tvshim.py`` (which is inert
where torchvision's ops load) and steps aside, and the normal import of torchvision proceeds. Nothing is imported
at start-up but this file; the package itself is not imported. ``ATTENTION_ZOO_TVSHIM=0`` disables the hook, and
the ``.pth`` line does nothing once attention_zoo is uninstalled.
"""

from __future__ import annotations

import importlib.util
import os
import sys

PTH_NAME = "attention_zoo_tvshim.pth"
# Runs at interpreter start (site.py executes .pth lines that begin with "import"): load this very file, by the
# absolute path written at install time, and install the finder; never fail the interpreter. The path is fixed at
# install time rather than looked up at start-up, because a look-up through sys.path would find, and execute, an
# ``./attention_zoo/adapters/_tvhook.py`` of the current directory whenever sys.path holds '' or '.'. Once the
# package is uninstalled or moved, the file is gone and the line does nothing.
_HOOK = ("try:\n import importlib.util as u, os\n p = {path!r}\n if os.path.isfile(p):\n"
         "  sp = u.spec_from_file_location('attention_zoo.adapters._tvhook', p)\n"
         "  m = u.module_from_spec(sp); sp.loader.exec_module(m); m.install()\nexcept Exception:\n pass\n")


def pth_line() -> str:
    """The ``.pth`` line that loads this file by its absolute, link-free path."""
    return f"import sys; exec({_HOOK.format(path=os.path.realpath(__file__))!r})\n"


class TorchvisionShimFinder:
    """Meta-path finder: on the first import of ``torchvision``, apply the shim, then let the import go on."""

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname == "torchvision":
            uninstall()
            try:
                _load_shim()
            except Exception:  # the shim is a convenience: torchvision's own error is the better message
                pass
        return None


def _load_shim():
    if "attention_zoo.adapters._tvshim" in sys.modules:
        return sys.modules["attention_zoo.adapters._tvshim"]
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_tvshim.py")
    spec = importlib.util.spec_from_file_location("attention_zoo.adapters._tvshim", path)
    module = importlib.util.module_from_spec(spec)
    # Registered under its package name: ``import attention_zoo`` later finds it there and does not run it twice.
    sys.modules["attention_zoo.adapters._tvshim"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["attention_zoo.adapters._tvshim"]
        raise
    return module


def install() -> bool:
    """Put the finder on ``sys.meta_path`` (unless torchvision is already imported or ATTENTION_ZOO_TVSHIM=0)."""
    if os.environ.get("ATTENTION_ZOO_TVSHIM", "1") == "0" or "torchvision" in sys.modules:
        return False
    if not any(f is TorchvisionShimFinder for f in sys.meta_path):
        sys.meta_path.insert(0, TorchvisionShimFinder)
    return True


def uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if f is not TorchvisionShimFinder]


def _site_dir() -> str:
    import sysconfig

    return sysconfig.get_paths()["purelib"]


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m attention_zoo.adapters._tvhook",
                                     description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--install", action="store_true", help=f"write {PTH_NAME} into site-packages")
    group.add_argument("--uninstall", action="store_true", help=f"remove {PTH_NAME} from site-packages")
    parser.add_argument("--site-dir", default=None, help="the site-packages directory (default: this interpreter's)")
    args = parser.parse_args(argv)
    target = os.path.join(args.site_dir or _site_dir(), PTH_NAME)
    if args.install:
        import tempfile

        fd, tmp = tempfile.mkstemp(prefix=f".{PTH_NAME}.", dir=os.path.dirname(target))  # never a planted link
        try:
            with os.fdopen(fd, "w") as f:
                f.write(pth_line())
            os.chmod(tmp, 0o644)  # site-packages files are world-readable
            os.replace(tmp, target)
        except BaseException:
            os.unlink(tmp)
            raise
        print(f"wrote {target}")
    elif os.path.exists(target):
        os.remove(target)
        print(f"removed {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

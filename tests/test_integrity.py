"""Files that are unpickled are checksum-verified on every load; refused checkpoints fall back to older ones."""

import hashlib
import io
import os
import pickle
import tarfile
import warnings

import pytest
import torch

from attention_zoo.data import images as di
from attention_zoo.data.fetch import DatasetError
from attention_zoo.data.text import RemoteCorpus, fetch_corpus
from attention_zoo.engine.checkpoint import _HEADER, MAGIC, CheckpointManager
from attention_zoo.metrics import images as mi


class Payload:
    """Unpickling this creates ``marker``: proof that the pickle was executed."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _cifar10_tree(root, poisoned: dict[str, bytes] | None = None) -> dict[str, str]:
    spec = di.CIFAR["cifar10"]
    folder = root / spec.folder
    folder.mkdir(parents=True)
    sums = {}
    for k, f in enumerate(spec.files["train"] + spec.files["test"] + (spec.meta,)):
        blob = pickle.dumps({"data": [[k] * 3072], spec.label_key: [k], spec.names_key: ["a"]})
        (folder / f).write_bytes((poisoned or {}).get(f, blob))
        sums[f] = hashlib.md5(blob).hexdigest()
    return sums


def test_poisoned_pickle_in_pre_extracted_cifar_is_not_executed(tmp_path):
    marker = tmp_path / "executed"
    evil = pickle.dumps(Payload(marker))
    _cifar10_tree(tmp_path / "data", {"data_batch_1": evil})
    with pytest.raises(di.DatasetError, match="MD5 .* refusing to unpickle"):
        di.load_cifar("cifar10", "train", data_dir=tmp_path / "data", download=False)
    assert not marker.exists()
    pickle.loads(evil)  # the payload is live: loading it unchecked would have run it
    assert marker.exists()


def test_pre_extracted_cifar_is_checked_file_by_file(tmp_path):
    sums = _cifar10_tree(tmp_path)
    got = di.load_cifar("cifar10", "train", data_dir=tmp_path, download=False, file_md5=sums)
    assert got.labels.tolist() == [0, 1, 2, 3, 4]
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").write_bytes(pickle.dumps({"data": [], "labels": []}))
    with pytest.raises(di.DatasetError, match="data_batch_3: MD5"):
        di.load_cifar("cifar10", "train", data_dir=tmp_path, download=False, file_md5=sums)


def test_extracted_cifar_is_checked_against_its_archive_members(tmp_path):
    sums = _cifar10_tree(tmp_path / "src")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        tf.add(tmp_path / "src" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    blob = buf.getvalue()
    data = tmp_path / "data"
    data.mkdir()
    (data / "cifar-10-python.tar.gz").write_bytes(blob)
    md5 = hashlib.md5(blob).hexdigest()
    first = di.load_cifar("cifar10", "test", data_dir=data, download=False, md5=md5)  # extracts
    assert first.labels.tolist() == [5]
    evil = pickle.dumps(Payload(tmp_path / "executed"))
    (data / "cifar-10-batches-py" / "test_batch").write_bytes(evil)  # swapped after extraction
    with pytest.raises(di.DatasetError, match="test_batch: MD5"):
        di.load_cifar("cifar10", "test", data_dir=data, download=False, md5=md5)
    assert not (tmp_path / "executed").exists()
    assert sums["test_batch"] == di._archive_member_md5(data / "cifar-10-python.tar.gz", md5,
                                                        "cifar-10-batches-py")["test_batch"]


def test_cached_inception_weights_are_verified_before_use(tmp_path, monkeypatch):
    src = tmp_path / "default_1.pt"
    src.write_bytes(b"pretend torchscript")
    monkeypatch.setattr(mi, "FID_HELPER_SHA1", hashlib.sha1(src.read_bytes()).hexdigest())
    monkeypatch.setattr(mi, "fid_helper_torchscript", lambda: src)
    monkeypatch.setattr(mi, "inception_state_dict", lambda path: {"w": torch.ones(2)})
    path = mi.inception_weights(tmp_path / "cache")  # built: file + digest
    assert mi._cached_weights_problem(path, path.with_name(path.name + ".sha256")) is None
    assert mi.inception_weights(tmp_path / "cache") == path
    # a poisoned file whose digest was forged as well: the weights_only check still refuses it
    marker = tmp_path / "executed"
    evil = pickle.dumps(Payload(marker))
    path.write_bytes(evil)
    path.with_name(path.name + ".sha256").write_text(hashlib.sha256(evil).hexdigest())
    with pytest.warns(RuntimeWarning, match="weights_only"):
        assert mi.inception_weights(tmp_path / "cache") == path
    assert not marker.exists()
    assert torch.equal(torch.load(path, weights_only=True)["w"], torch.ones(2))  # rebuilt
    path.write_bytes(path.read_bytes() + b"x")  # altered bytes: digest mismatch
    with pytest.warns(RuntimeWarning, match="SHA-256"):
        mi.inception_weights(tmp_path / "cache")


def test_explicit_extractor_weights_must_be_plain_tensors(tmp_path):
    marker = tmp_path / "executed"
    bad = tmp_path / "weights.pth"
    bad.write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(ValueError, match="^weights_path:"):
        mi.get_extractor(mi.DEFAULT_EXTRACTOR, str(bad))
    assert not marker.exists()


def test_extracted_corpus_is_checked_on_every_load(tmp_path):
    good = bytes(range(256)) * 4
    spec = RemoteCorpus("enwik8", "http://127.0.0.1:9/enwik8.zip", "enwik8.zip", "enwik8", None,
                        hashlib.sha256(good).hexdigest(), None)
    raw = tmp_path / "enwik8" / "enwik8"
    raw.parent.mkdir()
    raw.write_bytes(good)
    assert fetch_corpus(spec, tmp_path, download_ok=False) == raw
    raw.write_bytes(good[:-1] + b"!")
    with pytest.raises(DatasetError, match="SHA-256 mismatch"):
        fetch_corpus(spec, tmp_path, download_ok=False)


def _write_raw_checkpoint(path, payload: bytes):
    path.write_bytes(_HEADER.pack(MAGIC, len(payload), hashlib.sha256(payload).digest()) + payload)


def test_checkpoint_refused_by_weights_only_falls_back_to_the_previous(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=3)
    mgr.save({"step": 1, "w": torch.ones(2)}, 1)
    marker = tmp_path / "executed"
    buf = io.BytesIO()
    torch.save({"format_version": 1, "evil": Payload(marker)}, buf)  # a valid header over an unsafe payload
    _write_raw_checkpoint(mgr.step_path(2), buf.getvalue())
    mgr.step_path(3).write_bytes(b"junk")  # and a corrupt newest one
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path, state = mgr.resolve("auto")
    assert path == mgr.step_path(1) and state["step"] == 1
    messages = [str(w.message) for w in caught]
    assert any("step_00000003.pt" in m for m in messages) and any("weights_only" in m for m in messages)
    assert not marker.exists()


def test_checkpoint_that_is_not_a_dict_falls_back(tmp_path):
    mgr = CheckpointManager(tmp_path)
    mgr.save({"step": 4}, 4)
    buf = io.BytesIO()
    torch.save([1, 2], buf)
    _write_raw_checkpoint(mgr.step_path(5), buf.getvalue())
    with pytest.warns(RuntimeWarning, match="format_version"):
        path, state = mgr.resolve("auto")
    assert state["step"] == 4 and os.path.basename(path) == "step_00000004.pt"

"""Char-level corpora: 90/5/5 splits, bpc, checksummed download from a loopback server, clear errors, the embedded
Shakespeare default, the position-addressable sampler and the exact full-split evaluator."""

from __future__ import annotations

import hashlib
import http.server
import io
import math
import threading
import zipfile
from functools import partial

import numpy as np
import pytest
import torch

from attention_zoo.data.fetch import DatasetError, DatasetNotFoundError
from attention_zoo.data.text import (
    DATA_ENV,
    REMOTE,
    RemoteCorpus,
    WindowEvaluator,
    WindowSampler,
    bpc,
    fetch_corpus,
    load_char_corpus,
    resolve_data_dir,
    sha256_file,
    split_bytes,
    split_sizes,
)


def _zip_bytes(member: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(member, data)
    return buf.getvalue()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path):
    """A loopback HTTP server over ``tmp_path/www``, serving synthetic enwik8.zip and text8.zip."""
    www = tmp_path / "www"
    www.mkdir()
    rng = np.random.default_rng(0)
    payloads = {"enwik8": bytes(rng.integers(0, 256, 20_000, dtype=np.uint8)),
                "text8": bytes(rng.choice(np.frombuffer(b"abcdefghijklmnopqrstuvwxyz ", np.uint8), 20_000))}
    for name, data in payloads.items():
        (www / f"{name}.zip").write_bytes(_zip_bytes(name, data))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_QuietHandler, directory=str(www)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    specs = {name: RemoteCorpus(name, f"{base}/{name}.zip", f"{name}.zip", name,
                                sha256_file(www / f"{name}.zip"), hashlib.sha256(data).hexdigest(), n_bytes=None)
             for name, data in payloads.items()}
    yield specs, payloads
    httpd.shutdown()
    httpd.server_close()


def test_split_sizes_are_90_5_5():
    assert split_sizes(10**8) == (90_000_000, 5_000_000, 5_000_000)
    assert split_sizes(1000) == (900, 50, 50)
    assert split_sizes(1019) == (919, 50, 50)  # 5 % each, floor; training keeps the remainder
    data = np.arange(1000) % 251
    parts = split_bytes(data)
    assert [len(parts[k]) for k in ("train", "val", "test")] == [900, 50, 50]
    np.testing.assert_array_equal(np.concatenate([parts["train"], parts["val"], parts["test"]]), data)


def test_bpc_is_nats_over_ln2():
    assert bpc(math.log(2)) == pytest.approx(1.0)
    assert bpc(1.0) == pytest.approx(1.4426950408889634)


def test_checksum_of_synthetic_file(tmp_path):
    p = tmp_path / "f.bin"
    p.write_bytes(b"attention" * 1000)
    assert sha256_file(p, chunk=7) == hashlib.sha256(b"attention" * 1000).hexdigest()


def test_real_corpora_pin_checksums_and_first_1e8_bytes():
    for spec in REMOTE.values():
        assert spec.url.startswith("http://mattmahoney.net/dc/") and spec.n_bytes == 10**8
        assert len(spec.archive_sha256) == 64 and len(spec.member_sha256) == 64


def test_download_from_loopback_and_mix(server, tmp_path):
    specs, payloads = server
    data_dir = tmp_path / "data"
    c = load_char_corpus("enwik8", data_dir, remote=specs)
    assert (data_dir / "enwik8" / "enwik8.zip").is_file() and (data_dir / "enwik8" / "enwik8").is_file()
    assert c.sizes["enwik8"] == {"train": 18_000, "val": 1_000, "test": 1_000}
    assert c.decode(c.train[0][:50]) == payloads["enwik8"][:50]
    mix = load_char_corpus("mix", data_dir, remote=specs)  # enwik8 now from disk, text8 downloaded
    assert len(mix.train) == 2 and set(mix.val) == set(mix.test) == {"enwik8", "text8"}
    assert mix.symbols == bytes(sorted(set(payloads["enwik8"]) | set(payloads["text8"])))
    assert mix.decode(mix.test["text8"][:20]) == payloads["text8"][19_000:19_020]


def test_checksum_mismatch_is_rejected(server, tmp_path):
    specs, _ = server
    bad = RemoteCorpus(**{**specs["text8"].__dict__, "archive_sha256": "0" * 64})
    with pytest.raises(DatasetError, match="SHA-256 mismatch"):
        fetch_corpus(bad, tmp_path / "data")
    assert not any((tmp_path / "data" / "text8").iterdir())  # nothing half-downloaded is kept
    bad_member = RemoteCorpus(**{**specs["text8"].__dict__, "member_sha256": "0" * 64})
    with pytest.raises(DatasetError, match="SHA-256 mismatch"):
        fetch_corpus(bad_member, tmp_path / "data")


def test_missing_corpus_and_bad_paths_give_clear_errors(server, tmp_path, monkeypatch):
    specs, _ = server
    with pytest.raises(DatasetNotFoundError, match="enwik8.zip"):
        load_char_corpus("enwik8", tmp_path / "empty", download_ok=False, remote=specs)
    not_dir = tmp_path / "file"
    not_dir.write_text("x")
    with pytest.raises(ValueError, match="data_dir"):
        load_char_corpus("enwik8", not_dir, remote=specs)
    monkeypatch.setenv(DATA_ENV, str(tmp_path / "from_env"))
    assert resolve_data_dir() == tmp_path / "from_env"
    with pytest.raises(ValueError, match="dataset"):
        load_char_corpus("wikitext", tmp_path)
    offline = RemoteCorpus("enwik8", "http://127.0.0.1:9/enwik8.zip", "enwik8.zip", "enwik8", None, None)
    with pytest.raises(DatasetError, match="download of"):
        fetch_corpus(offline, tmp_path / "off")


def test_corrupt_zip_is_a_clear_error(tmp_path):
    spec = RemoteCorpus("enwik8", "http://127.0.0.1:9/enwik8.zip", "enwik8.zip", "enwik8", None, None, None)
    (tmp_path / "enwik8").mkdir()
    (tmp_path / "enwik8" / "enwik8.zip").write_bytes(b"PK\x03\x04 definitely not a zip")
    with pytest.raises(DatasetError, match="not a valid zip"):
        fetch_corpus(spec, tmp_path, download_ok=False)
    (tmp_path / "enwik8" / "enwik8.zip").write_bytes(_zip_bytes("other", b"abc"))
    with pytest.raises(DatasetError, match="no member"):
        fetch_corpus(spec, tmp_path, download_ok=False)


def test_shakespeare_default():
    c = load_char_corpus("shakespeare")
    n = sum(c.sizes["shakespeare"].values())
    assert n == 5_057_198 and c.vocab_size == 84
    assert c.sizes["shakespeare"]["val"] == c.sizes["shakespeare"]["test"] == n * 5 // 100


def test_sampler_is_position_addressable_and_mixes_equally():
    a, b = np.arange(0, 100) % 50, np.arange(0, 100) % 50 + 50  # disjoint symbol sets
    s = WindowSampler([a, b], context=8, batch_size=6, seed=3)
    x, y = s(7)
    x2, _ = WindowSampler([a, b], context=8, batch_size=6, seed=3)(7)
    assert torch.equal(x, x2) and not torch.equal(x, s(8)[0])
    assert x.dtype == torch.int64 and x.shape == (6, 8)
    assert torch.equal((x[:, 1:] - x[:, :-1]) % 50, torch.ones(6, 7, dtype=torch.int64))  # contiguous windows
    assert torch.equal(y[:, :-1], x[:, 1:])
    assert bool((x[0::2] < 50).all()) and bool((x[1::2] >= 50).all())  # window i from stream i mod 2
    with pytest.raises(ValueError, match="sampler"):
        WindowSampler([a], 8, 6, seed=4).load_state_dict(s.state_dict())
    with pytest.raises(ValueError, match="streams"):
        WindowSampler([a[:5]], 8, 6)


@pytest.mark.parametrize("stride", [None, 3, 1])
def test_evaluator_scores_every_target_exactly_once(stride):
    data = np.arange(103)
    ev = WindowEvaluator(data, context=8, batch_size=4, stride=stride)
    scored = []
    for x, y in ev():
        assert x.shape[1] == 8 and torch.equal(y[y != -100] - 1, (x + 0)[y != -100])
        scored += y[y != -100].tolist()
    assert sorted(scored) == list(range(1, 103)) and ev.n_targets == 102
    sub = [t for _, y in ev(limit=1) for t in y[y != -100].tolist()]
    assert 0 < len(sub) < 102 and set(sub) <= set(scored)
    assert "context 8" in ev.describe()
    with pytest.raises(ValueError, match="stride"):
        WindowEvaluator(data, 8, 4, stride=9)

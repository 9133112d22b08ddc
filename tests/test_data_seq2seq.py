"""Seq2seq data: packing and target-only loss masks, greedy decoding to EOS, loaders, tokenisers, concept task."""

import json
import sys
import types

import pytest
import torch

from attention_zoo.data.fetch import DatasetError, DatasetNotFoundError
from attention_zoo.data.seq2seq import (
    COMMONGEN_PROMPT,
    IGNORE_INDEX,
    STOP_WORDS,
    ByteTokenizer,
    HFTokenizer,
    Seq2SeqEvaluator,
    Seq2SeqSampler,
    concept_pairs,
    encode_pairs,
    greedy_decode,
    lm_batch,
    load_seq2seq,
    load_tokenizer,
    pack,
)
from attention_zoo.models.decoder import Decoder, ModelOutput

TOK = ByteTokenizer()


def test_byte_tokenizer_round_trip():
    text = "Fair is foul — and foul is fair ✓"
    ids = TOK.encode(text)
    assert min(ids) >= 4 and max(ids) < TOK.vocab_size
    assert TOK.decode([TOK.bos_id, *ids, TOK.eos_id, TOK.pad_id]) == text


def test_pack_layout_and_target_only_loss_mask():
    enc = encode_pairs([("ab", "xyz"), ("abcd", "q")], TOK)
    p = pack(enc, TOK)
    B, S, E, P = TOK.bos_id, TOK.sep_id, TOK.eos_id, TOK.pad_id
    a, b, c, d, x, y, z, q = (TOK.encode(ch)[0] for ch in "abcdxyzq")
    assert p.tokens.tolist() == [[B, a, b, S, x, y, z, E], [B, a, b, c, d, S, q, E]]
    assert p.loss_mask.tolist() == [[0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 1, 1]]
    assert p.prompt_len.tolist() == [4, 6] and bool(p.padding_mask.all())
    p = pack(enc[:1], TOK, pad_to=10)
    assert p.tokens[0, 8:].tolist() == [P, P] and p.padding_mask[0].tolist() == [True] * 8 + [False] * 2
    assert not bool(p.loss_mask[0, 8:].any())
    inputs, pm, targets = lm_batch(p)
    assert inputs.shape == targets.shape == pm.shape == (1, 9)
    assert targets[0].tolist() == [IGNORE_INDEX] * 3 + [x, y, z, E] + [IGNORE_INDEX] * 2  # SEP predicts x
    with pytest.raises(ValueError, match="^pad_to"):
        pack(enc, TOK, pad_to=5)


def test_truncation_keeps_eos():
    enc = encode_pairs([("abcdef", "uvwxyz")], TOK, max_source_len=2, max_target_len=3)
    assert [len(enc[0].source), len(enc[0].target)] == [2, 3]
    assert pack(enc, TOK).tokens[0, -1] == TOK.eos_id
    with pytest.raises(ValueError, match="^max_target_len"):
        encode_pairs([("a", "b")], TOK, max_target_len=0)


class CountingModel(torch.nn.Module):
    """Emits token 'A' until it has written k tokens after SEP, then EOS; k = first source byte - ord('0')."""

    max_seq_len = 64

    def __init__(self):
        super().__init__()
        self.calls = []

    def forward(self, tokens, padding_mask):
        self.calls.append(tuple(tokens.shape))
        B, T = tokens.shape
        logits = torch.zeros(B, T, TOK.vocab_size)
        for i in range(B):
            n = int(padding_mask[i].sum())
            sep = (tokens[i, :n] == TOK.sep_id).nonzero()[0, 0]
            k = int(tokens[i, 1]) - 4 - ord("0")
            logits[i, n - 1, TOK.eos_id if n - 1 - sep >= k else TOK.encode("A")[0]] = 1.0
        return ModelOutput(logits, torch.zeros(()))


def test_greedy_decode_stops_per_sequence_at_eos():
    model = CountingModel()
    sources = [TOK.encode(s) for s in ("3xx", "0", "5abcdefgh", "1")]
    out = greedy_decode(model, sources, TOK, max_new_tokens=10)
    assert [TOK.decode(o) for o in out] == ["AAA", "", "AAAAA", "A"]
    assert model.calls[-1][0] == 1  # finished sequences leave the batch
    assert [len(o) for o in greedy_decode(CountingModel(), sources, TOK, max_new_tokens=2)] == [2, 0, 2, 1]
    assert [len(o) for o in greedy_decode(CountingModel(), sources[2:3], TOK, max_new_tokens=10, max_len=13)] == [2]
    with pytest.raises(ValueError, match="^max_new_tokens"):
        greedy_decode(model, sources, TOK, max_new_tokens=0)


def test_greedy_decode_batch_equals_single():
    torch.manual_seed(0)
    model = Decoder(TOK.vocab_size, 32, 2, 4, max_seq_len=64)
    sources = [TOK.encode(s) for s in ("abc", "a much longer source", "z")]
    batched = greedy_decode(model, sources, TOK, max_new_tokens=6, batch_size=3)
    single = [greedy_decode(model, [s], TOK, max_new_tokens=6)[0] for s in sources]
    assert batched == single and all(len(o) <= 6 for o in batched)


def test_samplers():
    enc = encode_pairs([(f"s{i}", f"target {i}") for i in range(10)], TOK)
    x, pm, y = Seq2SeqSampler(enc, TOK, 4, seed=1)(3)
    x2, _, y2 = Seq2SeqSampler(enc, TOK, 4, seed=1)(3)
    assert torch.equal(x, x2) and torch.equal(y, y2) and x.shape[0] == 4 and pm.dtype == torch.bool
    batches = list(Seq2SeqEvaluator(enc, TOK, 4)())
    assert [len(b[0]) for b in batches] == [4, 4, 2] and len(list(Seq2SeqEvaluator(enc, TOK, 4)(limit=2))) == 2


def test_concept_task():
    pairs = concept_pairs()
    assert len(pairs) > 10_000
    for src, tgt in pairs[:300]:
        words = src.split()
        assert words == sorted(set(words)) and 3 <= len(words) <= 8 and not set(words) & STOP_WORDS
        assert all(w in tgt.lower() for w in words) and 8 <= len(tgt.split()) <= 20
    d = load_seq2seq("concepts", seed=0)
    assert sum(len(v) for v in d.splits.values()) == len(pairs) and d.origin == "embedded"
    assert len(d.splits["val"]) == len(d.splits["test"]) == len(pairs) * 5 // 100
    assert load_seq2seq("concepts", seed=0).splits["val"] == d.splits["val"]
    assert load_seq2seq("concepts", seed=1).splits["val"] != d.splits["val"]
    assert len(load_seq2seq("concepts", max_train=100).splits["train"]) == 100


def test_local_files(tmp_path):
    root = tmp_path / "wmt14"
    root.mkdir()
    (root / "train.tsv").write_text("hello world\thallo welt\nthe house\tdas haus\n")
    (root / "val.jsonl").write_text(json.dumps({"source": "good", "target": "gut"}) + "\n")
    d = load_seq2seq("wmt14", data_dir=tmp_path, max_train=1)
    assert d.splits["train"] == [("hello world", "hallo welt")] and d.splits["test"] == [("good", "gut")]
    assert d.origin.startswith("local:")
    (root / "train.tsv").write_text("no tab here\n")
    with pytest.raises(DatasetError, match=r"train\.tsv:1"):
        load_seq2seq("wmt14", data_dir=tmp_path)


def test_missing_data_says_how(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    with pytest.raises(DatasetNotFoundError, match=r"datasets.*train\.tsv"):
        load_seq2seq("commongen", data_dir=tmp_path)
    with pytest.raises(ValueError, match="^name"):
        load_seq2seq("wmt16", data_dir=tmp_path)


def test_hf_datasets_adapters(tmp_path, monkeypatch):
    rows = {"wmt/wmt14": [{"translation": {"en": "house", "de": "Haus"}}],
            "allenai/common_gen": [{"concepts": ["dog", "run"], "target": "A dog runs."}]}
    calls = []

    def load_dataset(path, config=None, split=None):
        calls.append((path, config, split))
        return rows[path]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    w = load_seq2seq("wmt14", data_dir=tmp_path, max_train=5)
    assert w.splits["test"] == [("house", "Haus")] and ("wmt/wmt14", "de-en", "train[:5]") in calls
    c = load_seq2seq("commongen", data_dir=tmp_path)
    assert c.splits["val"] == [(COMMONGEN_PROMPT + "dog, run", "A dog runs.")]


def test_hf_tokenizer_wrapper(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[CLS]": 1, "[SEP]": 2, "[UNK]": 3, "hello": 4, "world": 5}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    hf = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
                                 unk_token="[UNK]")
    t = HFTokenizer(hf)  # BERT-like: no BOS/EOS
    assert (t.bos_id, t.sep_id, t.eos_id, t.pad_id) == (1, 2, 2, 0)
    assert t.encode("hello world") == [4, 5] and t.decode([1, 4, 5, 2, 0]) == "hello world"
    hf.save_pretrained(tmp_path / "tok")
    assert load_tokenizer(str(tmp_path / "tok")).encode("world hello") == [5, 4]
    with pytest.raises(DatasetNotFoundError, match="not available locally"):
        load_tokenizer(str(tmp_path / "missing"))

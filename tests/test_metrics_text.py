"""Text metrics: @Top-50 rules on hand-made scores, per-sample files, per-example NLL, BERTScore offline,
BARTScore's formula on a tiny random BART."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attention_zoo.data.seq2seq import ByteTokenizer, encode_pairs, lm_batch, pack
from attention_zoo.metrics import text as mt
from attention_zoo.metrics.topk import (
    feature_top50,
    nll_top50,
    read_per_sample,
    score_top50,
    write_per_sample,
)
from attention_zoo.models.decoder import Decoder

TOK = ByteTokenizer()


def test_top50_rules_on_hand_made_scores():
    nll = np.array([2.0, 0.5, 3.0, 0.5, 1.0, 4.0])
    scores = np.array([-1.0, -6.0, -0.5, -2.0, -3.0, -0.1])
    new = nll_top50(nll, scores, k=3)  # lowest NLL: 1, 3 (tie, by index), 4
    assert new.rule == "nll_top50" and new.indices.tolist() == [1, 3, 4] and new.value == pytest.approx(-11 / 3)
    old = score_top50(scores, k=3)  # highest scores: 5, 2, 0
    assert old.rule == "score_top50" and old.indices.tolist() == [5, 2, 0] and old.value == pytest.approx(-1.6 / 3)
    fd = feature_top50([0.3, 0.1, 0.2], [1.0, 2.0, 4.0], k=2)
    assert fd.indices.tolist() == [1, 2] and fd.value == pytest.approx(3.0)
    many = score_top50(np.arange(60.0))
    assert many.k == 50 and many.value == pytest.approx(np.arange(10.0, 60.0).mean()) and not many.fallback


def test_top50_rules_errors_and_fallback():
    with pytest.raises(ValueError, match="needs at least k=50"):
        score_top50(np.zeros(10))
    few = nll_top50(np.arange(4.0), -np.arange(4.0), allow_fewer=True)
    assert few.fallback and few.k == 4 and few.n == 4 and few.value == pytest.approx(-1.5)
    with pytest.raises(ValueError, match="^scores.*non-finite"):
        score_top50([1.0, float("nan")], k=1)
    with pytest.raises(ValueError, match="^scores: expected 3"):
        nll_top50([1.0, 2.0, 3.0], [1.0], k=1)
    with pytest.raises(ValueError, match="^k"):
        score_top50([1.0], k=0)


def test_per_sample_round_trip(tmp_path):
    path = write_per_sample(tmp_path / "ps" / "cell.jsonl", {"nll": np.array([1.5, 0.25]), "bartscore": [-3.0, -4.0]},
                            variant="mha", dataset="concepts", seed=0)
    df = read_per_sample(path)
    assert df["index"].tolist() == [0, 1] and df["nll"].tolist() == [1.5, 0.25] and set(df["variant"]) == {"mha"}
    assert nll_top50(df["nll"], df["bartscore"], k=1).value == -4.0
    with pytest.raises(ValueError, match="^columns"):
        write_per_sample(path, {"a": [1], "b": [1, 2]})
    with pytest.raises(ValueError, match="^columns"):
        write_per_sample(path, {"seed": [1]}, seed=0)


@torch.no_grad()
def test_per_example_nll_matches_direct_computation():
    torch.manual_seed(0)
    model = Decoder(TOK.vocab_size, 32, 2, 4, max_seq_len=128).double()
    enc = encode_pairs([("dog run", "A dog runs."), ("sea", "The sea is wide and deep."), ("x y", "Why?")], TOK)
    nll = mt.per_example_nll(model, enc, TOK, batch_size=2)
    for i, e in enumerate(enc):  # one unpadded example at a time
        p = pack([e], TOK)
        logits = model(p.tokens[:, :-1]).logits[0]
        sel = p.loss_mask[0, 1:]
        direct = F.cross_entropy(logits[sel], p.tokens[0, 1:][sel])
        assert nll[i] == pytest.approx(float(direct), rel=1e-9)
    x, pm, y = lm_batch(pack(enc, TOK))  # the training batch's mean equals the token-weighted mean of the NLLs
    mean = F.cross_entropy(model(x, pm).logits.transpose(1, 2), y, ignore_index=-100)
    weights = np.array([len(e.target) + 1 for e in enc])
    assert float(mean) == pytest.approx(float((nll * weights).sum() / weights.sum()), rel=1e-9)


def test_bertscore_offline():
    cands = ["A man is playing a guitar.", "The cat sleeps on the sofa.", "Stock prices fell sharply today."]
    refs = ["A person plays the guitar.", "A cat is sleeping on the couch.", "The children built a sandcastle."]
    s = mt.bertscore(cands, refs)
    assert s["f1"].shape == (3,) and s["f1"][0] > s["f1"][2] + 0.2 and s["f1"][1] > s["f1"][2] + 0.2
    with pytest.raises(ValueError, match="^references"):
        mt.bertscore(cands, refs[:2])


def _tiny_bart():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import BartConfig, BartForConditionalGeneration, PreTrainedTokenizerFast

    words = "the a dog cat runs sleeps fast on mat".split()
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, **{w: i + 4 for i, w in enumerate(words)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  unk_token="<unk>")
    cfg = BartConfig(vocab_size=len(vocab), d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                     decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
                     pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
    torch.manual_seed(0)
    return BartForConditionalGeneration(cfg).double().eval(), tok


def test_bartscore_formula_on_tiny_bart():
    model, tok = _tiny_bart()
    hyps = ["the dog runs", "a cat sleeps on the mat", "dog"]
    refs = ["a dog runs fast", "the cat sleeps", "the mat"]
    got = mt.BARTScorer(model, tok, batch_size=2).score(hyps, refs)  # batched and padded
    for i, (h, r) in enumerate(zip(hyps, refs)):
        src = torch.tensor([tok(h)["input_ids"]])
        tgt = tok(r)["input_ids"]  # <s> ... </s>
        dec, total = [model.config.decoder_start_token_id], 0.0
        with torch.no_grad():
            for t in tgt:  # log P(t | hypothesis, earlier reference tokens), one position at a time
                logits = model(input_ids=src, decoder_input_ids=torch.tensor([dec])).logits[0, -1]
                total += float(logits.log_softmax(-1)[t])
                dec.append(t)
        assert got[i] == pytest.approx(total / len(tgt), rel=1e-9)
    assert all(v < 0 for v in got) and math.isfinite(float(got.sum()))


def test_bartscore_missing_weights_says_how(tmp_path):
    with pytest.raises(mt.ModelNotAvailableError, match=r"facebook/bart-base.*ATTENTION_ZOO_BART"):
        mt.BARTScorer(str(tmp_path / "no-bart"))
    with pytest.raises(ValueError, match="^tokenizer"):
        mt.BARTScorer(_tiny_bart()[0])

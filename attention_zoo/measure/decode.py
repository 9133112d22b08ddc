"""What a variant costs at inference: ``python -m attention_zoo.bench decode``.

Cached generation in a Hugging Face GPT-2 host (``zoo.swap_attention``; random weights, vocabulary 256) with each
variant swapped in: for every context length L (default 128 … 4096), a prefill of L random tokens, then
``new_tokens`` greedy decoding steps with the ``DynamicCache``; per-token latency is the median of those steps.
The swapped attentions decode by recomputation (the cache stores each layer's attention inputs and the attention
runs over the whole prefix: exact for every causal variant), so a step costs O(L) and more, and the table shows by
how much. Memory: the peak RSS increment over the built model (CPU; contexts run in increasing order, so the peak
at L is the largest so far) or ``max_memory_allocated`` (CUDA). Every variant runs in its own fresh process. A
variant that cannot decode with a cache (a stack-shared attention: its context spans the whole sequence) gets a
``not supported`` row with the reason. Sizes that can never work (``d_model`` not a multiple of the heads, a context
whose position table and cache alone exceed the device's memory) are refused before any work; a row that fails
(``error``) makes the command exit 1 after every row is written.
"""

from __future__ import annotations

import argparse
import json
import numbers
import os
import resource
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import torch

from ..cli import DeviceAction, HelpFormatter, cli_main, positive_int
from ..envinfo import device_name, resolve_device
from ..io import atomic_write_csv
from ..registry import select_attentions
from ..results import ensure_out_file
from .plain_loop import plain_env

CONTEXTS = (128, 512, 1024, 2048, 4096)


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _child(p: dict) -> list[dict]:
    from transformers import GPT2Config, GPT2LMHeadModel

    import attention_zoo as zoo

    torch.set_num_threads(int(p["threads"]))
    device = torch.device(p["device"])
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=256, n_embd=p["d_model"], n_layer=p["layers"], n_head=p["heads"],
                     n_positions=max(p["contexts"]) + p["new_tokens"])
    rows = []
    base = {"variant": p["variant"], "d_model": p["d_model"], "layers": p["layers"], "heads": p["heads"]}
    try:
        model = zoo.swap_attention(GPT2LMHeadModel(cfg), p["variant"], **p["options"]).to(device).eval()
    except ValueError as exc:
        return [{**base, "status": "not supported", "message": str(exc)}]
    params = sum(t.numel() for t in model.parameters())
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else _rss_mib()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    gen = torch.Generator().manual_seed(1)
    try:
        with torch.no_grad():  # one untimed call: first-call set-up is not a context's cost
            warm = model(torch.randint(0, 256, (1, 8), generator=gen).to(device), use_cache=True)
            model(warm.logits[:, -1:].argmax(-1), past_key_values=warm.past_key_values, use_cache=True)
    except ValueError as exc:  # the adapter's refusal (e.g. use_cache with a stack-shared attention)
        return [{**base, "status": "not supported", "message": str(exc)}]
    del warm
    for L in p["contexts"]:
        row = {**base, "context": L, "params": params}
        try:
            ids = torch.randint(0, 256, (1, L), generator=gen).to(device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            with torch.no_grad():
                sync()
                t0 = time.perf_counter()
                out = model(ids, use_cache=True)
                sync()
                prefill = time.perf_counter() - t0
                steps = []
                for _ in range(p["new_tokens"]):
                    nxt = out.logits[:, -1:].argmax(-1)
                    sync()
                    t0 = time.perf_counter()
                    out = model(nxt, past_key_values=out.past_key_values, use_cache=True)
                    sync()
                    steps.append(time.perf_counter() - t0)
            peak = ((torch.cuda.max_memory_allocated(device) - before) / 2**20 if device.type == "cuda"
                    else _rss_mib() - before)
            q25, med, q75 = np.percentile(steps, [25, 50, 75]) * 1e3
            rows.append({**row, "status": "ok", "message": None, "prefill_ms": 1e3 * prefill, "per_token_ms": med,
                         "per_token_q25_ms": q25, "per_token_q75_ms": q75, "peak_mib": peak})
        except RuntimeError as exc:  # OOM and the like: the longer contexts would fail too
            rows.append({**row, "status": "error", "message": f"{type(exc).__name__}: {exc}"})
            break
    return rows


def _device_bytes(device: torch.device) -> int | None:
    """The device's total memory in bytes (None where it cannot be read)."""
    try:
        if device.type == "cuda":
            return int(torch.cuda.get_device_properties(device).total_memory)
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, RuntimeError, AttributeError):
        return None


def check_sizes(contexts, new_tokens: int, d_model: int, layers: int, heads: int, threads: int | None,
                device: torch.device) -> list[int]:
    """The sorted contexts, once every size is one that can work: positive ints, ``d_model`` a multiple of
    ``heads``, and the longest context's lower-bound memory (GPT-2's position table plus the cached attention
    inputs of every layer, float32) within the device's total memory.

    Raises:
        ValueError: the first bad size, the message starting with its argument's name.
    """
    def whole(arg: str, v, low: int = 1) -> int:
        if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < low:
            raise ValueError(f"{arg}: expected an int >= {low}, got {v!r}")
        return int(v)

    if isinstance(contexts, (str, bytes)) or not hasattr(contexts, "__iter__"):
        raise ValueError(f"contexts: expected a list of context lengths, got {contexts!r}")
    contexts = sorted({whole("contexts", c) for c in contexts})
    if not contexts:
        raise ValueError("contexts: expected at least one context length")
    new_tokens, d_model, layers, heads = (whole(a, v) for a, v in (("new_tokens", new_tokens), ("d_model", d_model),
                                                                    ("layers", layers), ("heads", heads)))
    if threads is not None:
        whole("threads", threads)
    if d_model % heads:
        raise ValueError(f"d_model: {d_model} is not divisible by heads ({heads}); expected a multiple of heads")
    positions = contexts[-1] + new_tokens
    need = 4 * d_model * positions * (1 + layers)  # float32 position table + each layer's cached inputs
    have = _device_bytes(device)
    if have is not None and need > have:
        raise ValueError(f"contexts: a context of {contexts[-1]} tokens (+ {new_tokens} new) needs at least "
                         f"{need / 2**30:.3g} GiB on {device} for the position table and the cache alone, more "
                         f"than the device's {have / 2**30:.3g} GiB")
    return contexts


def decode_benchmark(variants: str = "*", contexts=CONTEXTS, new_tokens: int = 8, d_model: int = 256,
                     layers: int = 4, heads: int = 8, device: str = "cpu", threads: int | None = None,
                     options: dict | None = None, timeout_s: float = 3600.0) -> pd.DataFrame:
    """One row per variant × context (module docstring); each variant in a fresh process.

    Raises:
        ValueError: an unknown variant or a size that can never work (``check_sizes``), before any work.
    """
    dev = resolve_device(device)
    contexts = check_sizes(contexts, new_tokens, d_model, layers, heads, threads, dev)
    names = select_attentions(variants)
    rows = []
    for name in names:
        payload = {"variant": name, "contexts": sorted(contexts), "new_tokens": new_tokens, "d_model": d_model,
                   "layers": layers, "heads": heads, "device": str(dev), "options": dict(options or {}),
                   "threads": threads or torch.get_num_threads()}
        proc = subprocess.run([sys.executable, "-m", "attention_zoo.measure.decode", "--child"],
                              input=json.dumps(payload), capture_output=True, text=True, env=plain_env(),
                              timeout=timeout_s)
        lines = [x for x in proc.stdout.splitlines() if x.startswith("[")]
        if proc.returncode or not lines:
            why = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            rows.append({"variant": name, "status": "error", "message": f"decode child failed: {why}"})
            continue
        rows += json.loads(lines[-1])
    df = pd.DataFrame(rows)
    df["device"], df["device_name"], df["new_tokens"] = str(dev), device_name(dev), new_tokens
    return df


@cli_main
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv == ["--child"]:
        print(json.dumps(_child(json.loads(sys.stdin.read())), default=str))
        return 0
    p = argparse.ArgumentParser(prog="python -m attention_zoo.bench decode", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--variants", default="*", help="comma-separated names or wildcards")
    p.add_argument("--contexts", type=positive_int, nargs="+", default=list(CONTEXTS), help="context lengths")
    p.add_argument("--new-tokens", type=positive_int, default=8, help="decoding steps timed per context")
    p.add_argument("--d-model", type=positive_int, default=256)
    p.add_argument("--layers", type=positive_int, default=4)
    p.add_argument("--heads", type=positive_int, default=8)
    p.add_argument("--device", action=DeviceAction, default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    p.add_argument("--csv", default=None, help="CSV of the rows")
    args = p.parse_args(argv)
    if args.csv:
        ensure_out_file(args.csv, "csv")
    select_attentions(args.variants)  # every argument checked before any work
    check_sizes(args.contexts, args.new_tokens, args.d_model, args.layers, args.heads, args.threads,
                resolve_device(args.device))
    df = decode_benchmark(args.variants, args.contexts, args.new_tokens, args.d_model, args.layers, args.heads,
                          args.device, args.threads)
    cols = [c for c in ("variant", "context", "status", "prefill_ms", "per_token_ms", "peak_mib", "params", "message")
            if c in df]
    with pd.option_context("display.width", 220, "display.max_colwidth", 80):
        print(df[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    if args.csv:
        atomic_write_csv(df, args.csv)
    failed = df[df["status"] == "error"]
    for r in failed.itertuples():
        print(f"warning: {r.variant}: decode failed ({r.message})", file=sys.stderr)
    return 1 if len(failed) else 0  # as the benchmark: every row written, a failure in the exit code


if __name__ == "__main__":
    sys.exit(main())

"""Drop-in: put any registered attention into a model you already have (``zoo.swap_attention``).

Supported hosts (each self-attention module is replaced by a thin adapter, in ``host_adapters.py`` and
``hf_adapters.py``, that speaks the host's calling convention and owns one of our attention modules as ``.attn``):

- timm ``VisionTransformer`` (timm 1.0.x): every ``timm.layers.Attention`` (``forward(x, attn_mask, is_causal)``);
  non-causal. The host's ``proj_drop`` is kept.
- Hugging Face ``GPT2LMHeadModel`` / ``GPT2Model`` (transformers 5.x): every self-attention ``GPT2Attention``;
  causal, with the padding of ``attention_mask``. ``use_cache`` works: the cache holds each layer's attention
  *input* and the layer recomputes over the prefix, which is exact for every variant because they are causal
  (``DynamicCache`` only). The host's ``resid_dropout`` is kept.
- Hugging Face ``LlamaForCausalLM``, ``MistralForCausalLM``, ``Qwen2ForCausalLM`` (and their base models): every
  ``LlamaAttention`` / ``MistralAttention`` / ``Qwen2Attention``; causal, padding as GPT-2, and the host's rotary
  ``position_embeddings`` reach the new attention as ``rotary`` (its ``rotary_ok`` capability; each variant rotates
  its own queries and keys, docs/variants.md §0.4). ``use_cache`` as GPT-2 (the cache also keeps each position's
  cos/sin). Sliding windows are refused; grouped K/V heads are refused for copying.
- ``torch.nn.MultiheadAttention`` (bare, or inside ``nn.TransformerEncoderLayer`` / ``nn.TransformerEncoder``):
  ``batch_first`` both ways, unbatched inputs, ``key_padding_mask``, ``attn_mask`` (bool: True = masked, or
  float) and ``is_causal``. The module returns ``(output, None)``: attention weights are not returned.

Mask conventions are converted to ours (``padding_mask`` True = real token, ``attn_mask`` True = visible or
float). Padded positions follow our contract: they are neither keys nor part of any context, and the
attention output at a padded query is zero (the hosts compute something there); real positions are unchanged.

Causality is fixed when the module is built (our variants compute differently when causal, e.g. DAMCHA's prefix
means), so each adapter checks every call of more than one position: a causal call (``is_causal`` or a mask hiding
every future key) to a non-causal attention, or the reverse, raises a ValueError naming the module path and the
``causal=`` to pass.

With ``copy_weights=True`` (default) the host's projections (and biases; a missing host bias is copied as zero) are
copied where the new attention has a faithful place for them (``host_weights.py``): all four in the MHA layout (with
``name="mha"`` the swapped model reproduces the original's outputs), V and the output projection in variants with a
query/key path of their own (DAMCHA, ColMHA); a warning names what stays freshly initialised. The swap records the
parameter counts before and after and the parts copied as ``model.attention_zoo_swap`` (and logs them on the
``attention_zoo`` logger), and warns when the model grows more than 2×. After a stack-shared swap an HF model's
``config`` and ``generation_config`` get ``use_cache=False``, so ``model.generate(ids)`` works with its defaults.

A swap is all or nothing: every layer's attention is built, checked and filled before the first one is put in
place, so a refusal (at any layer) leaves the model as it was.

Width, heads and attention dropout are the host's: the
options ``d_model``, ``n_heads``, ``dropout`` (and the backbone's ``stack``, ``n_layers``, ``rotary``) are refused.

Stack-shared variants (spec flag ``stack_shared``) get one shared module per stack of swapped layers, built with the
attention class's ``build_stack_shared`` hook exactly as ``models.AttentionStack`` does. A stack is the set of
swapped layers whose blocks one module holds (``transformer.h``, ``blocks``, ``layers``, ``model.layers``), so two
towers in one model (two GPT-2s, a ViT encoder and a GPT-2 decoder) have a context each. Each stack's module is
registered on the model as ``attention_zoo_shared`` (the next ones ``attention_zoo_shared_1``, ...; a
``SharedStackContext``), which computes the stack context once per forward with the class's ``stack_context(shared,
x, padding_mask)`` hook on the input of the stack's first swapped layer's block (a forward pre-hook on that block;
the hosts' blocks are pre-LN, so this is the residual stream, as in ``AttentionStack``) and hands it to every layer;
each layer gets ``stack=StackShare(shared, i, n_layers)``. Where no known block encloses the first layer (a bare
``nn.MultiheadAttention``), that layer computes the context on its own input. Whether anything is shared is the
variant's own option (DAMCHA: ``share_mlp``, default True). Copies (``copy.deepcopy``, pickling) carry their own
context and hooks; gradient checkpointing (HF ``gradient_checkpointing_enable()``, timm
``set_grad_checkpointing()``) works in its default non-reentrant form and is refused in the reentrant one.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..registry import create_attention, get_attention_spec
from ..variants.base import StackShare
from .hf import GPT2AttentionAdapter, LlamaAttentionAdapter
from .hosts import HostLayout, TimmAttentionAdapter, TorchMultiheadAttentionAdapter, _fail, _Swapped
from .weights import PARTS, copy_projections, copy_targets, disable_cache, n_params, report_swap

__all__ = ["swap_attention", "SharedStackContext"]

_SHARED_NAME = "attention_zoo_shared"
HOSTS: tuple[type[_Swapped], ...] = (TorchMultiheadAttentionAdapter, TimmAttentionAdapter, GPT2AttentionAdapter,
                                     LlamaAttentionAdapter)
# What each host attention fixes, and what swap_attention sets itself: refused among the options.
_FIXED = {"d_model": "the host attention's width", "n_heads": "the host attention's head count",
          "dropout": "the host attention's dropout", "stack": "set by swap_attention for stack-shared variants",
          "n_layers": "the number of swapped layers", "rotary": "the host's positions, handed at every call"}


# ---- stack sharing -----------------------------------------------------------------------------------------
class SharedStackContext(nn.Module):
    """Owns the module shared by one stack of swapped layers (``build_stack_shared``) and computes its stack context
    (``stack_context(x, padding_mask)``) once per forward, on the input of the stack's first swapped layer's block.

    The context of a forward run with autograd stays until the next forward begins: gradient checkpointing recomputes
    each block during backward, and the recomputation must see the same context. Copies start without one."""

    def __init__(self, attention_cls: type, shared: nn.Module, n_layers: int, path: str):
        super().__init__()
        self.shared, self.n_layers, self.path = shared, n_layers, path
        self._attention_cls = attention_cls
        self._ctx, self._ready, self._shape, self._grad = None, False, None, False

    _hooked = False

    def __getstate__(self):
        # deepcopy and pickle: the context belongs to the original's forward (and may hold graph tensors, which
        # deepcopy refuses)
        state = super().__getstate__()
        state.update(_ctx=None, _ready=False, _shape=None)
        return state

    def clear(self) -> None:
        self._ctx, self._ready = None, False

    def finish(self) -> None:
        """After the stack's last block: drop the context unless a backward (with recomputation) may follow."""
        if not torch.is_grad_enabled():
            self.clear()

    def begin(self, x: Tensor, padding_mask: Tensor | None) -> None:
        self._ctx = self._attention_cls.stack_context(self.shared, x, padding_mask)
        self._ready, self._shape, self._grad = True, tuple(x.shape[:2]), torch.is_grad_enabled()

    def context_for(self, layer: _Swapped, x: Tensor, padding_mask: Tensor | None):
        """The context of this forward. Without an enclosing block that announced it (a bare swapped module, or a
        host whose blocks are not known), the first layer computes it on its own input, and any layer does when the
        stored one is for another batch shape.

        Raises:
            ValueError: (hooked stacks) a layer run without its stack's first block in the same forward, or without
                autograd while the context has it: both are what reentrant gradient checkpointing does.
        """
        shape = tuple(x.shape[:2])
        if not self._hooked:
            if not self._ready or layer.layer_idx == 0 or self._shape != shape:
                self.begin(x, padding_mask)
            return self._ctx
        reentrant = ("gradient checkpointing with use_reentrant=True recomputes each block on its own; use "
                     "use_reentrant=False (the default of HF's gradient_checkpointing_enable and timm's "
                     "set_grad_checkpointing) or share_mlp=False")
        if not self._ready or self._shape != shape:
            raise _fail(layer.path, f"the stack context of this forward is missing (the layer ran without the first "
                                    f"block of its stack, {self.path}); {reentrant}")
        if self._grad and not torch.is_grad_enabled():
            raise _fail(layer.path, f"runs without autograd inside a forward whose stack context has it; {reentrant}")
        return self._ctx


class _StackBegin:
    """Forward pre-hook on the block around a stack's first swapped layer: computes the stack context. An object,
    not a closure, so that deepcopy and pickle carry it to a copy, where it drives the copy's own context."""

    def __init__(self, stack: SharedStackContext, adapter: _Swapped):
        self.stack, self.adapter = stack, adapter

    def __call__(self, _block, args, kwargs):
        got = self.adapter.block_input(args, kwargs)
        if got is None:
            self.stack.clear()
            return
        x, padding = got
        if padding is not None:
            padding = self.adapter.attn.check_inputs(x, padding, None)[0]
        self.stack.begin(x, padding)


class _StackEnd:
    """Forward hook on the block around a stack's last swapped layer (see ``SharedStackContext.finish``)."""

    def __init__(self, stack: SharedStackContext):
        self.stack = stack

    def __call__(self, _block, _args, _kwargs, _out):
        self.stack.finish()


def _install_stack_hooks(stack: SharedStackContext, first: tuple, last: tuple) -> None:
    (first_adapter, first_block), (_, last_block) = first, last
    if first_block is None or last_block is None:
        return
    first_block.register_forward_pre_hook(_StackBegin(stack, first_adapter), with_kwargs=True)
    last_block.register_forward_hook(_StackEnd(stack), with_kwargs=True)
    stack._hooked = True


def _stack_key(name: str) -> str:
    """The stack a host attention belongs to: the module holding its block (``transformer.h.0.attn`` ->
    ``transformer.h``; the root when there is none)."""
    parts = name.split(".")
    return ".".join(parts[:-2])


# ---- building ----------------------------------------------------------------------------------------------
def _find_hosts(model: nn.Module, root: str):
    found, unknown = [], []
    inside = set()
    for name, module in model.named_modules():
        path = f"{root}.{name}" if name else root
        if any(name.startswith(p + ".") for p in inside) or isinstance(module, _Swapped):
            continue
        kind = next((cls for cls in HOSTS if cls.matches(module)), None)
        if kind is not None:
            parent, attr = None, None
            if name:
                parent_name, _, attr = name.rpartition(".")
                parent = model.get_submodule(parent_name)
            found.append((path, name, kind, module, parent, attr))
            inside.add(name)
        elif type(module).__name__.endswith("Attention") and not hasattr(module, "_attend"):
            unknown.append((name, path, module))
    for name, path, module in unknown:
        holds_host = any(h_name.startswith(name + ".") or not name for _, h_name, *_ in found)
        if not holds_host and not any(name.startswith(s + ".") for s in inside):
            raise _fail(path, f"{type(module).__name__} is not a supported host attention (supported: "
                              f"{', '.join(cls.host_types for cls in HOSTS)})")
    return found


def _check_options(root: str, spec, hosts: list, layouts: list[HostLayout], causal: bool | None, options: dict):
    fixed = sorted(set(options) & set(_FIXED))
    if fixed:
        raise ValueError(f"{root}: {fixed[0]}: fixed by the host ({_FIXED[fixed[0]]}); swap_attention takes d_model, "
                         "n_heads and dropout from each host attention, so set it on the host")
    for (path, _, kind, *_), lay in zip(hosts, layouts):
        if causal is False and lay.causal_lm:
            raise _fail(path, f"causal: {kind.host_name} is a causal language model; causal=False is not supported")
        if lay.rotary_width is not None and not spec.rotary_ok:
            raise _fail(path, f"{spec.name!r} does not apply rotary positions (no rotary_ok capability), which "
                              f"{kind.host_name} hands to every attention")


def _build_stacks(root, spec, hosts, layouts, is_causal, opts) -> dict[str, SharedStackContext]:
    """{stack key: its SharedStackContext} for a stack-shared variant whose options share a module."""
    stacks = {}
    for key in dict.fromkeys(_stack_key(h[1]) for h in hosts):
        idx = [i for i, h in enumerate(hosts) if _stack_key(h[1]) == key]
        first = layouts[idx[0]]
        if len({is_causal[i] for i in idx}) > 1 or len({layouts[i][:2] for i in idx}) > 1:
            raise _fail(hosts[idx[0]][0], "a stack-shared attention needs one width, head count and causality across "
                                          "the swapped layers of a stack")
        try:
            shared = spec.cls.build_stack_shared(n_layers=len(idx), d_model=first.d_model, n_heads=first.n_heads,
                                                 causal=is_causal[idx[0]], dropout=first.dropout, **opts)
        except ValueError as e:
            raise _fail(hosts[idx[0]][0], str(e)) from e
        if shared is None:
            return {}
        path = f"{root}.{key}" if key else root
        stacks[key] = SharedStackContext(spec.cls, shared, len(idx), path)
    return stacks


def swap_attention(model: nn.Module, name: str, *, causal: bool | None = None, copy_weights: bool = True,
                   root_name: str = "model", **options) -> nn.Module:
    """Replace every self-attention of ``model`` by the registered attention ``name`` (built with ``options``).

    Args:
        model: a timm ``VisionTransformer``, an HF GPT-2 or Llama/Mistral/Qwen2 model, an
            ``nn.TransformerEncoder(Layer)``, an ``nn.MultiheadAttention``, or any module containing them.
        name: a registered attention (``zoo.list_attentions()``).
        causal: build causal attentions; default: the host's (GPT-2 and the Llama family causal, timm ViT and torch
            non-causal). Every call is checked against it.
        copy_weights: copy the host's q/k/v/out projections into attentions with the MHA projection layout.
        root_name: the name used for ``model`` in error messages (``"model.blocks.3.attn: ..."``).
        **options: the variant's options (``create_attention``); for a stack-shared variant they decide what
            ``build_stack_shared`` shares (DAMCHA: ``share_mlp``, default True: one generator per stack).

    Returns:
        ``model``, modified in place (or the adapter, when ``model`` is itself an ``nn.MultiheadAttention``).

    Raises:
        ValueError: unknown ``name`` or option; an option the host fixes (``d_model``, ``n_heads``, ``dropout``, and
            ``stack``, ``n_layers``, ``rotary``); a model without a supported self-attention; an unsupported layout
            (cross-attention, an unknown attention type, ``dim_out != dim``, head counts that do not divide the
            width, ``causal=False`` on a causal LM, a sliding window, a variant without ``rotary_ok`` or whose
            rotated widths the host's rotary width does not divide on a Llama-family host); ``copy_weights`` with a
            host feature our projections cannot express (qk-norm, add_bias_kv, grouped K/V heads, a non-standard
            logit scale, ...). Messages start with the module path.
    """
    spec = get_attention_spec(name)
    if not isinstance(model, nn.Module):
        raise ValueError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if causal is not None and not isinstance(causal, bool):
        raise ValueError(f"causal: expected a bool or None, got {causal!r}")
    if not isinstance(copy_weights, bool):
        raise ValueError(f"copy_weights: expected a bool, got {copy_weights!r}")
    hosts = _find_hosts(model, root_name)
    if not hosts:
        raise ValueError(f"{root_name}: no supported self-attention found "
                         f"({', '.join(cls.host_types for cls in HOSTS)})")
    layouts = [kind.layout(host, path, parent, attr) for path, _, kind, host, parent, attr in hosts]
    opts = {k: v for k, v in options.items() if v is not None}
    _check_options(root_name, spec, hosts, layouts, causal, opts)
    if "bias" in spec.options and "bias" not in opts:
        opts["bias"] = any(lay.weights[1] is not None or lay.weights[3] is not None for lay in layouts)

    before, copied = n_params(model), set(PARTS)
    is_causal = [causal if causal is not None else lay.causal for lay in layouts]
    stacks = _build_stacks(root_name, spec, hosts, layouts, is_causal, opts) if spec.stack_shared else {}
    # Every layer is built and checked before any is replaced: a refusal at layer k leaves the model as it was.
    built = []
    for i, ((path, h_name, kind, host, parent, attr), lay) in enumerate(zip(hosts, layouts)):
        key = _stack_key(h_name)
        members = [h for h in hosts if _stack_key(h[1]) == key]
        layer_idx = next(j for j, h in enumerate(members) if h[1] == h_name)
        stack = stacks.get(key)
        share = StackShare(stack.shared if stack else None, layer_idx, len(members)) if spec.stack_shared else None
        try:
            attn = create_attention(name, d_model=lay.d_model, n_heads=lay.n_heads, causal=is_causal[i],
                                    dropout=lay.dropout, stack=share, **opts)
        except ValueError as e:
            raise _fail(path, str(e)) from e
        ref = next(host.parameters(), None)
        if ref is not None:
            attn.to(device=ref.device, dtype=ref.dtype)
        r = lay.rotary_width
        bad = [w for w in attn.rotary_widths() if r is not None and w % r]
        if bad:
            raise _fail(path, f"rotary: the host's rotary width {r} does not divide the width {bad[0]} of the "
                              f"vectors {name!r} rotates (rotary_widths())")
        targets = copy_targets(attn, lay.d_model) if copy_weights else {}
        if targets:
            if lay.why_not_copy is not None:
                raise _fail(path, f"cannot copy the host's weights faithfully into {name!r} (it takes the host's "
                                  f"{', '.join(targets)} projections): {lay.why_not_copy}; pass copy_weights=False "
                                  "to swap in a freshly initialised attention")
            copy_projections(targets, lay.weights, lay.d_model, path)
        copied &= set(targets)  # the parts every swapped layer took
        adapter = kind.from_host(attn, path, host)
        adapter.layer_idx = layer_idx
        adapter.train(host.training)
        if stack is not None:
            object.__setattr__(adapter, "_stack", stack)
        built.append((key, kind, host, parent, attr, adapter))

    adapters, added = {}, []
    try:
        for key, kind, _host, parent, attr, adapter in built:
            if parent is None:
                model = adapter
            else:
                setattr(parent, attr, adapter)
            adapters.setdefault(key, []).append((adapter, parent if kind.is_block(parent, adapter) else None))
        for key, stack in stacks.items():
            first = hosts[next(i for i, h in enumerate(hosts) if _stack_key(h[1]) == key)][3]
            ref = next(first.parameters(), None)
            if ref is not None:
                stack.to(device=ref.device, dtype=ref.dtype)
            stack.train(first.training)
            n = 0
            while hasattr(model, _SHARED_NAME + (f"_{n}" if n else "")):  # a second swap or tower: the next free name
                n += 1
            model.add_module(_SHARED_NAME + (f"_{n}" if n else ""), stack)
            added.append(_SHARED_NAME + (f"_{n}" if n else ""))
            _install_stack_hooks(stack, adapters[key][0], adapters[key][-1])
    except BaseException:  # put every host attention back
        for _key, _kind, host, parent, attr, _adapter in built:
            if parent is not None:
                setattr(parent, attr, host)
        for n in added:
            delattr(model, n)
        raise
    for module in model.modules():  # nested-tensor fast path would hand our adapters NestedTensors
        if isinstance(module, nn.TransformerEncoder):
            module.use_nested_tensor = False
    no_cache = bool(stacks) and disable_cache(model)  # a stack context covers the whole sequence
    report_swap(model, root_name, name, before, copied, copy_weights, no_cache)
    return model

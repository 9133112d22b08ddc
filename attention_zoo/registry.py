"""Name -> attention class, with capability flags (timm / xformers style).

Backbones and benchmarks read an attention's capabilities from its spec (``get_attention_spec``)
instead of branching on its name.
"""

from __future__ import annotations

import ast
import fnmatch
import inspect
import json
import re
from dataclasses import dataclass

# Who reads each flag is listed in docs/design.md ("No branching on names").
CAPABILITY_FLAGS = (
    "causal_ok",  # supports causal masking without leaking future tokens
    "fused_kernel",  # runs on F.scaled_dot_product_attention (no [B,H,T,S] tensor kept)
    "needs_full_logits",  # must materialise [B,H,T,S] logits/weights (head mixing)
    "data_dependent_compute",  # compute depends on the input (routing)
    "has_aux_loss",  # sets ``aux_loss`` in forward; backbones collect auxiliary losses only from such variants
    "stack_shared",  # takes a ``stack`` argument and shares a module across a stack (build_stack_shared hook)
    "has_metric",  # exposes get_M_matrices()
    "control",  # a control arm for deciding claims (docs/claims.md): listed only on request or by name
    "rotary_ok",  # applies rotary positions (forward's ``rotary``) to its queries and keys
    "subspace_towers",  # its heads never exchange information: the backbone keeps the head slices apart throughout
)
ATTENTION_CORES = ("fused", "full logits", "explicit")
CONTROLS_TOKEN = "controls"  # in a selection: every registered control arm


# The constructor argument through which a backbone tells a ``stack_shared`` layer its place in the stack
# (``variants.base.StackShare``): passed by ``create_attention(..., stack=...)``, never among the options.
BACKBONE_ARGUMENT = "stack"


@dataclass(frozen=True)
class AttentionSpec:
    name: str
    cls: type
    flavors: tuple[str, ...]
    capabilities: dict[str, bool]
    description: str

    def __getattr__(self, item):  # spec.fused_kernel etc.
        caps = object.__getattribute__(self, "capabilities")
        if item in caps:
            return caps[item]
        raise AttributeError(item)

    @property
    def core(self) -> str:
        """How the attention core runs, from ``fused_kernel`` / ``needs_full_logits``: ``"fused"`` (SDPA, no
        [B,H,T,S] tensor kept), ``"full logits"`` (must keep [B,H,T,S]: head mixing) or ``"explicit"`` (keeps it,
        though a fused kernel would apply). Benchmarks report it beside memory, whose growth in T it explains."""
        caps = self.capabilities
        return ATTENTION_CORES[0 if caps["fused_kernel"] else 1 if caps["needs_full_logits"] else 2]

    @property
    def options(self) -> tuple[str, ...]:
        """Keyword options accepted by create_attention beyond d_model/n_heads/causal/dropout (and ``stack``, which
        a backbone sets: it is not a user option)."""
        sig = inspect.signature(self.cls.__init__)
        skip = {"self", "d_model", "n_heads", "causal", "dropout", BACKBONE_ARGUMENT}
        params = sig.parameters.values()
        named = tuple(p.name for p in params if p.name not in skip and p.kind is not inspect.Parameter.VAR_KEYWORD)
        return named + tuple(getattr(self.cls, "extra_options", ()))  # options taken through **kwargs


_REGISTRY: dict[str, AttentionSpec] = {}


def register_attention(name: str):
    """Class decorator: ``@register_attention("mha")``. Rejects duplicate names and classes that are not
    ``AttentionBase`` subclasses (their forward would not validate inputs or resolve masks as the contract says).

    Raises:
        ValueError: a bad or already registered ``name``, or ``cls`` not an ``AttentionBase`` subclass.
    """

    def deco(cls):
        from .variants.base import AttentionBase  # here: variants import this module to register themselves

        if not isinstance(name, str) or not name or name != name.lower():
            raise ValueError(f"name: expected a non-empty lower-case string, got {name!r}")
        if name in _REGISTRY:
            raise ValueError(f"name: attention {name!r} is already registered ({_REGISTRY[name].cls.__qualname__})")
        if name == CONTROLS_TOKEN:
            raise ValueError(f"name: {name!r} is reserved (it selects every control arm)")
        if not (isinstance(cls, type) and issubclass(cls, AttentionBase)):
            raise ValueError(f"cls: {name!r} must be a subclass of attention_zoo.AttentionBase, got "
                             f"{getattr(cls, '__qualname__', cls)!r}")
        caps = {flag: bool(getattr(cls, flag, False)) for flag in CAPABILITY_FLAGS}
        doc = (inspect.getdoc(cls) or "").split("\n")[0]
        flavors = tuple(getattr(cls, "flavors", ("paper",)))
        _REGISTRY[name] = AttentionSpec(name, cls, flavors, caps, doc)
        cls.registry_name = name
        return cls

    return deco


def _unknown(name) -> ValueError:
    return ValueError(f"name: unknown attention {name!r}; available: {', '.join(sorted(_REGISTRY))}")


def get_attention_spec(name: str) -> AttentionSpec:
    if name not in _REGISTRY:
        raise _unknown(name)
    return _REGISTRY[name]


def is_attention(name: str) -> bool:
    return name in _REGISTRY


def list_controls() -> list[str]:
    """Sorted names of the registered control arms (the ``control`` capability; docs/claims.md)."""
    return sorted(n for n, s in _REGISTRY.items() if s.capabilities["control"])


def list_attentions(pattern: str | list[str] | None = None, exclude: str | list[str] | None = None,
                    include_controls: bool = False) -> list[str]:
    """Sorted registered names, filtered by fnmatch wildcards (``"*mha"``, ``["d*", "mha"]``). Control arms (the
    ``control`` flag) are left out unless ``include_controls`` or named exactly in ``pattern``."""
    exact = set([pattern] if isinstance(pattern, str) else pattern or [])
    names = [n for n in sorted(_REGISTRY)
             if include_controls or not _REGISTRY[n].capabilities["control"] or n in exact]
    if pattern is not None:
        pats = [pattern] if isinstance(pattern, str) else list(pattern)
        names = [n for n in names if any(fnmatch.fnmatch(n, p) for p in pats)]
    if exclude is not None:
        pats = [exclude] if isinstance(exclude, str) else list(exclude)
        names = [n for n in names if not any(fnmatch.fnmatch(n, p) for p in pats)]
    return names


def select_attentions(spec: str) -> list[str]:
    """Comma-separated names or wildcards (``"mha,d*"``) -> registered names, in the order named. Wildcards match
    the variants; control arms are selected by their exact name or all at once by the token ``controls``.

    Raises:
        ValueError: a pattern matching no registered attention, or an empty selection (the message lists the
            available ones).
    """
    names = list_attentions()
    chosen: list[str] = []
    for pat in (s.strip() for s in spec.split(",") if s.strip()):
        if pat == CONTROLS_TOKEN:
            hits = list_controls()
        elif pat in _REGISTRY:
            hits = [pat]
        else:
            hits = [n for n in names if fnmatch.fnmatch(n, pat)]
        if not hits:
            every = names + list_controls() + [CONTROLS_TOKEN]
            raise ValueError(f"variants: {pat!r} matches no registered attention; available: {', '.join(every)}")
        chosen += [h for h in hits if h not in chosen]
    if not chosen:
        raise ValueError(f"variants: empty selection; available: {', '.join(names + list_controls())}")
    return chosen


_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0")


def _parse_value(raw: str, bool_option: bool = False):
    """A ``key=value`` value: bool options take true/false/yes/no/1/0 only; ``(a, b)`` is a tuple of numbers
    (``()`` the empty one); otherwise int, float or string."""
    low = raw.strip().lower()
    if low.startswith("(") and low.endswith(")"):
        try:
            items = ast.literal_eval(f"({low[1:-1]},)" if low[1:-1].strip() else "()")
        except (SyntaxError, ValueError):
            raise ValueError(f"expected a tuple of numbers such as (256, 512), got {raw!r}") from None
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in items):
            raise ValueError(f"expected a tuple of numbers such as (256, 512), got {raw!r}")
        return tuple(items)
    if bool_option:
        if low in _TRUE or low in _FALSE:
            return low in _TRUE
        raise ValueError(f"expected true/false/yes/no/1/0, got {raw!r}")
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


def parse_option_rows(items: list[str]) -> list[tuple[str, dict, str]]:
    """``["damcha:collapsed_generator=true"]`` -> [(name, options, label)]: extra rows for an option setting.

    Raises:
        ValueError: a malformed item, or an unknown attention name.
    """
    out = []
    for item in items:
        name, sep, rest = item.partition(":")
        pairs = [kv for kv in re.split(r",(?![^()]*\))", rest) if kv]  # commas inside (...) belong to a tuple
        if not sep or not pairs or any("=" not in kv for kv in pairs):
            raise ValueError(f"extra: expected name:key=value[,key=value], got {item!r}")
        get_attention_spec(name.strip())
        bools = get_attention_spec(name.strip()).cls.bool_options()
        options = {}
        for k, v in (kv.split("=", 1) for kv in pairs):
            try:
                options[k.strip()] = _parse_value(v.strip(), k.strip() in bools)
            except ValueError as exc:
                raise ValueError(f"extra: {name.strip()}:{k.strip()}: {exc}") from None
        out.append((name.strip(), options, f"{name.strip()}[{rest}]"))
    return out


def split_options(name: str, options: dict) -> tuple[dict, dict]:
    """Split ``options`` into (accepted by ``name``, not accepted). None values are dropped (timm style)."""
    accepted = set(get_attention_spec(name).options)
    ok = {k: v for k, v in options.items() if v is not None and k in accepted}
    rest = {k: v for k, v in options.items() if v is not None and k not in accepted}
    return ok, rest


def resolved_options(name: str, options: dict | None = None) -> dict:
    """Every keyword option of ``name`` with the value a module built with ``options`` gets: the given value,
    else the constructor's default. Result cells record it, so a changed default is a different cell. An option the
    variant lists in ``added_options`` is left out while it holds the value listed there (its knob off)."""
    spec = get_attention_spec(name)
    params = inspect.signature(spec.cls.__init__).parameters
    empty = inspect.Parameter.empty
    out = {k: params[k].default for k in spec.options if k in params and params[k].default is not empty}
    out.update({k: v for k, v in (options or {}).items() if v is not None})
    # options added after result stores were written, at the value that computes what the variant computed before
    # them, are left out, so those stores keep their cell keys (as engine.config.NEUTRAL does for training fields)
    added = getattr(spec.cls, "added_options", {})
    return dict(sorted((k, v) for k, v in out.items() if not (k in added and _same(v, added[k]))))


def _same(a, b) -> bool:
    return type(a) is type(b) and a == b


def resolved_options_json(name: str, options: dict | None = None) -> str:
    """``resolved_options`` as JSON text: a result cell's ``attention_options`` field, which keys the cell by every
    option value its module gets, so a changed default is a different cell of that variant only."""
    return json.dumps(resolved_options(name, options), sort_keys=True, default=str)


def create_attention(name: str, *, d_model: int, n_heads: int, causal: bool = False, dropout: float = 0.0,
                     stack=None, **options):
    """Build a registered attention module.

    ``stack``: a ``StackShare`` set by a backbone for a variant with the ``stack_shared`` capability (the shared
    module, this layer's index, the stack's depth; docs/design.md, "Stack sharing"); None for a layer on its own.

    Raises:
        ValueError: unknown ``name`` (the message lists the available ones), an option the variant does not
            take, ``stack`` given to a variant without ``stack_shared``, or an illegal size/option value (the
            message names the argument).
    """
    spec = get_attention_spec(name)
    options = {k: v for k, v in options.items() if v is not None}
    unknown = sorted(set(options) - set(spec.options))
    if unknown:
        raise ValueError(
            f"options: {name!r} does not accept {', '.join(unknown)}; accepted options: {', '.join(spec.options)}"
        )
    if stack is not None:
        if not spec.stack_shared:
            raise ValueError(f"{BACKBONE_ARGUMENT}: {name!r} does not share modules across a stack (no stack_shared "
                             "capability)")
        options[BACKBONE_ARGUMENT] = stack
    return spec.cls(d_model=d_model, n_heads=n_heads, causal=causal, dropout=dropout, **options)

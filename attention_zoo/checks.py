"""Argument checks shared by variants, backbones, measurement and data: each raises a ValueError whose message
starts with the argument's name and says what was expected."""

from __future__ import annotations

import inspect
import math


def _err(arg: str, msg: str) -> ValueError:
    return ValueError(f"{arg}: {msg}")


def check_positive_int(name: str, value, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
        raise _err(name, f"expected a {'non-negative' if allow_zero else 'positive'} int, got {value!r}")
    return value


def check_choice(name: str, value, choices) -> str:
    if value not in choices:
        raise _err(name, f"expected one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def bool_params(init) -> tuple[tuple[str, bool], ...]:
    """(name, None allowed) of the keyword parameters of ``init`` annotated ``bool`` or ``bool | None``."""
    out = []
    for p in inspect.signature(init).parameters.values():
        ann = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", "")
        parts = {a.strip() for a in ann.replace("Optional[", "").rstrip("]").split("|")}
        if "bool" in parts and parts <= {"bool", "None"}:
            out.append((p.name, "None" in parts))
    return tuple(out)


def check_bool_options(init, args: tuple, kwargs: dict) -> None:
    """Raise ValueError naming the first ``bool`` option of ``init`` given a non-bool value ("no", 0, ...)."""
    params = getattr(init, "_bool_params", None)
    if params is None:
        params = bool_params(init)
    if not params:
        return
    bound = inspect.signature(init).bind_partial(None, *args, **kwargs).arguments
    for name, none_ok in params:
        if name in bound and not isinstance(bound[name], bool) and not (none_ok and bound[name] is None):
            raise _err(name, f"expected a bool{' or None' if none_ok else ''}, got {bound[name]!r}")


def check_fraction(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise _err(name, f"expected a float in [0, 1), got {value!r}")
    return float(value)


def check_int_at_least(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _err(name, f"expected an int >= {minimum}, got {value!r}")
    return value


def check_real(name: str, value, minimum: float | None = None) -> float:
    """A finite int or float (not bool), at least ``minimum`` when given."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _err(name, f"expected a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise _err(name, f"expected >= {minimum}, got {value!r}")
    return float(value)


class InputSetupError(RuntimeError):
    """Input data that could not be set up (a failed download, a checksum mismatch, an unreadable archive): the
    message names it and says what to do. Every CLI reports it as one ``error:`` line with exit code 2."""


class MissingInputError(FileNotFoundError):
    """Data, weights or another run's results that are not on disk (and may not be fetched): the message says how
    to provide them. Every CLI reports it as one ``error:`` line with exit code 2, like a bad argument."""

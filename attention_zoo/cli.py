"""Command-line helpers shared by every entry point (reproduce scripts, benchmarks): argparse types that validate
numbers up front, a help formatter that prints each default once, and ``cli_main``, which turns our ValueErrors into
one ``error:`` line and exit code 2."""

from __future__ import annotations

import argparse
import functools
import math
import sys

from .checks import MissingInputError


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" only where the help text does not state its default already, so it shows once."""

    def _get_help_string(self, action):
        text = action.help or ""
        flag = isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction))
        if "default" in text.lower() or flag or action.default in (None, argparse.SUPPRESS, []):
            return text
        return super()._get_help_string(action)


def _number(raw: str, kind):
    try:
        return kind(raw)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected {'an int' if kind is int else 'a number'}, got {raw!r}") from None


def positive_int(raw: str) -> int:
    """argparse type: an int >= 1 (threads, workers, batches, steps ...)."""
    v = _number(raw, int)
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {raw!r}")
    return v


def non_negative_int(raw: str) -> int:
    v = _number(raw, int)
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected an int >= 0, got {raw!r}")
    return v


def seed_int(raw: str) -> int:
    """argparse type: a seed in 0 … 2**32 − 1 (what NumPy accepts)."""
    v = _number(raw, int)
    if not 0 <= v < 2**32:
        raise argparse.ArgumentTypeError(f"expected a seed in 0 … 2**32 − 1, got {raw!r}")
    return v


def non_negative_float(raw: str) -> float:
    """argparse type: a finite float >= 0."""
    v = _number(raw, float)
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {raw!r}")
    return v


def device_arg(raw: str) -> str:
    """argparse type of every ``--device``: auto, or a device this machine has (``envinfo.resolve_device``), so a
    script refuses ``tpu`` or a missing GPU before it does any work. Kept as given (``auto`` resolves later)."""
    from .envinfo import resolve_device  # here: envinfo imports torch, which a --help need not wait for

    try:
        resolve_device(raw)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("device: ")) from None
    return raw


def positive_float(raw: str) -> float:
    v = non_negative_float(raw)
    if v == 0:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {raw!r}")
    return v


def cli_main(main):
    """Decorator for a script's ``main(argv)``: a ValueError (our bad-input errors, whose message names the
    argument) or a MissingInputError (data or weights not on disk; the message says how to get them) becomes one
    line ``error: <message>`` on stderr and exit code 2, like argparse's own errors, instead of a traceback."""

    @functools.wraps(main)
    def wrapped(argv: list[str] | None = None) -> int:
        try:
            return main(argv)
        except (ValueError, MissingInputError) as exc:
            print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
            return 2

    return wrapped

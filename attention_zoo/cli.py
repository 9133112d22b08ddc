"""Command-line helpers shared by every entry point (reproduce scripts, benchmarks): argparse types that validate
numbers up front, a help formatter that prints each default once, and ``cli_main``, which turns our ValueErrors into
one ``error:`` line and exit code 2."""

from __future__ import annotations

import argparse
import functools
import math
import sys

from .checks import InputSetupError, MissingInputError


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


class DeviceAction(argparse.Action):
    """``--device`` of every CLI: auto, or a device this machine has (``envinfo.resolve_device``), checked while the
    command line is parsed, so a script refuses ``tpu`` or a missing GPU before any work, with one ``error:`` line
    (``cli_main``) naming it. The value stays as given (``auto`` is resolved by the script)."""

    def __call__(self, parser, namespace, values, option_string=None):
        from .envinfo import resolve_device  # here: envinfo imports torch, which a --help need not wait for

        resolve_device(values)
        setattr(namespace, self.dest, values)


def positive_float(raw: str) -> float:
    v = non_negative_float(raw)
    if v == 0:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {raw!r}")
    return v


def cli_main(main):
    """Decorator for a script's ``main(argv)``: a ValueError (our bad-input errors, whose message names the
    argument), a MissingInputError (data or weights not on disk; the message says how to get them) or an
    InputSetupError (data that could not be downloaded or verified; the message says what to do) becomes one line
    ``error: <message>`` on stderr and exit code 2, like argparse's own errors, instead of a traceback."""

    @functools.wraps(main)
    def wrapped(argv: list[str] | None = None) -> int:
        try:
            return main(argv)
        except (ValueError, MissingInputError, InputSetupError) as exc:
            print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
            return 2

    return wrapped

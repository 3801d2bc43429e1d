"""The flag types and the one-line parser that the scripts and the tools share.

Light on purpose: nothing here imports TensorFlow, so a launcher
(tools/launch_workers.py) parses its flags as the scripts do without
loading it. A bad flag is one line and exit status 2 (OneLineParser); a
number is written the usual way or refused (`_parse`).
"""
import argparse
import functools
import re

from pyimagesearch.base.errors import UserError

EXIT_USER_ERROR = UserError.exit_status


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is reported in one line instead of usage + error.

    Abbreviated flags (`--dev tpu`) are refused: what runs before argparse
    (platforms/tpu_runtime.py) reads each flag by its whole name only.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message):
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message} (see --help)\n")


# what a person types: ASCII digits, a sign, a point, an exponent (int() and
# float() also take "1_0" and other scripts' digits, such as "٣")
_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|[+-]?(inf|nan)",
                      re.IGNORECASE)


def _parse(kind, text):
    """int(text) or float(text), for text written the usual way only; ValueError else."""
    if not (_INTEGER if kind is int else _DECIMAL).fullmatch(text.strip()):
        raise ValueError(text)
    return kind(text)


def _number(kind, minimum, text):
    """Parse `text` as `kind` and require it to be >= `minimum`."""
    try:
        value = _parse(kind, text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {'an integer' if kind is int else 'a number'}, got {text!r}")
    if not value >= minimum:  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {text}")
    return value


def bounded_int(minimum, maximum):
    """A flag type: an integer from `minimum` to `maximum`."""
    def parse(text):
        value = _number(int, minimum, text)
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum}, got {text}")
        return value

    parse.__name__ = "integer"
    return parse


MAX_SEED = 2**32 - 1  # NumPy's seed range, which keras.utils.set_random_seed uses
seed = bounded_int(0, MAX_SEED)  # an integer seed NumPy accepts


positive_int = functools.partial(_number, int, 1)
non_negative_int = functools.partial(_number, int, 0)
positive_int.__name__ = "positive integer"
non_negative_int.__name__ = "non-negative integer"


def step_range(text):
    """'A,B': the first and last training step (counted from 1) to profile."""
    first, comma, last = text.partition(",")
    try:
        first, last = _parse(int, first), _parse(int, last)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two steps A,B, got {text!r}")
    if not comma or not 1 <= first <= last:
        raise argparse.ArgumentTypeError(f"expected steps 1 <= A <= B, got {text!r}")
    return first, last


def positive_float(text):
    """A finite float > 0."""
    try:
        value = _parse(float, text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}")
    if not 0.0 < value < float("inf"):  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text}")
    return value

"""What the benchmark programs' command lines share: a filter that selects nothing is an error.

A misspelt `--only` or `--config` would otherwise run nothing, and `benchmarks.run` would
then write an empty report over the last one.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence


def check_selected(
    parser: argparse.ArgumentParser, chosen: Sequence, option: str, value: object, names: Iterable
) -> None:
    """Stop with `parser`'s usage error if `option`'s `value` left nothing of `names` to run.

    Args:
        parser: the program's parser; its `error` prints the usage and exits with status 2.
        chosen: what the filter selected.
        option: the option's flag, as the user typed it (`--only`).
        value: what the user gave it.
        names: the names the filter chose from, listed in the message.

    Example:
        >>> parser = argparse.ArgumentParser(prog="bench")
        >>> check_selected(parser, ["adam"], "--config", ["adam"], ["adam", "lion"])  # fine
    """
    if not chosen:
        listed = ", ".join(repr(name) for name in names)
        parser.error(f"{option} {value!r} selects nothing; the names are: {listed}")

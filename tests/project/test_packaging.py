"""The installed package is the one a user gets: its version, its type marker, its changelog."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import gradtx

ROOT = Path(__file__).resolve().parents[2]


def test_the_version_is_the_distributions():
    assert gradtx.__version__ == importlib.metadata.version("gradtx")


def test_the_package_is_typed():
    assert (Path(gradtx.__file__).parent / "py.typed").is_file()


def test_the_changelog_names_this_version():
    assert f"## {gradtx.__version__}" in (ROOT / "CHANGELOG.md").read_text()

"""mkdocs hook: the notebooks of `notebooks/` become pages of the site, under `notebooks/`.

The committed notebooks hold no outputs. `make notebooks` (and so `make test` and `make
docs`) runs copies of them in `build/notebooks/` and keeps the outputs there; the site shows
those executed copies, so the one run that tests the notebooks also draws their plots. A
notebook without an executed copy, or whose copy no longer matches its cells, is shown
without outputs.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
EXECUTED = ROOT / "build"  # the executed copies: build/notebooks/<name>.ipynb

log = logging.getLogger("mkdocs.hooks.notebooks")


def _cells(path: Path) -> list[tuple[str, str]]:
    cells = json.loads(path.read_text())["cells"]
    return [(cell["cell_type"], "".join(cell["source"])) for cell in cells]


def _source_dir(notebook: Path) -> Path:
    """Where `notebooks/<name>.ipynb` is read from: the executed copy if it is current."""
    executed = EXECUTED / "notebooks" / notebook.name
    if executed.is_file() and _cells(executed) == _cells(notebook):
        return EXECUTED
    log.info("%s is shown without outputs (run `make notebooks`)", notebook.name)
    return ROOT


@event_priority(100)  # before mkdocs-jupyter looks for notebooks among the files
def on_files(files: Files, config) -> Files:
    """Add every `notebooks/*.ipynb` to the site's files (mkdocs calls this)."""
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        path = notebook.relative_to(ROOT).as_posix()
        source = _source_dir(notebook)
        files.append(File(path, str(source), config["site_dir"], config["use_directory_urls"]))
    return files

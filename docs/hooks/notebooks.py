"""mkdocs hook: the notebooks of `notebooks/` become pages of the site, under `notebooks/`.

They stay where the tests execute them; mkdocs-jupyter renders them (and runs them when
`GRADTX_DOCS_EXECUTE` is set, as `make docs` does, so the site shows their plots).
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]


@event_priority(100)  # before mkdocs-jupyter looks for notebooks among the files
def on_files(files: Files, config) -> Files:
    """Add every `notebooks/*.ipynb` to the site's files (mkdocs calls this)."""
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        path = notebook.relative_to(ROOT).as_posix()
        files.append(File(path, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files

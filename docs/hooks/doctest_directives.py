"""mkdocs hook: doctest directives (`# doctest: +ELLIPSIS`) are for the tests, not for readers.

The pages' and docstrings' examples keep them, as the tests need them; the rendered pages
drop them, so a reader neither sees nor copies them.
"""

from __future__ import annotations

import re

# A directive comment as the highlighter writes it, with the spaces before it.
HIGHLIGHTED = re.compile(r"[ \t]*<span class=\"c1\">#\s*doctest:[^<]*</span>")
# The same comment in plain text, after a statement on its line (a code block the highlighter
# did not colour); a mention in prose, `# doctest: +SKIP` alone in its code span, stays.
PLAIN = re.compile(r"(?<=\S)[ \t]+#\s*doctest:\s*[+-][A-Z_]+(?:\s*,?\s*[+-][A-Z_]+)*")


def on_page_content(html: str, **kwargs) -> str:
    """Remove every doctest directive from a page's HTML (mkdocs calls this)."""
    if "doctest:" not in html:
        return html
    return PLAIN.sub("", HIGHLIGHTED.sub("", html))

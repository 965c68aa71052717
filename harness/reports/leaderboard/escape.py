r"""Markdown escaping of text that plugins and users control.

Method names, settings, dataset names, check summaries, flags and failure messages end
up in table cells, headings and footnotes. :func:`md_text` makes such text inert in
CommonMark with the GitHub (GFM) extensions:

- control characters and line breaks (which would end a table row or a paragraph)
  become spaces;
- ``<``, ``>`` and ``&`` become HTML entities, so no raw HTML or entity passes through;
- the ASCII punctuation that can open a construct in running text (emphasis ``*`` ``_``,
  code ``\```, links, images and footnotes ``[`` ``]`` ``!``, strikethrough ``~``, math
  ``$``, table cells ``|``, closing heading ``#``, and ``\`` itself) is backslash-escaped
  (CommonMark §2.4: any ASCII punctuation may be). Without ``[`` no ``(`` can start a
  link, and our text never starts a line, so ``-``, ``+``, ``=``, ``.`` stay as they are;
- ``:`` and ``@`` are escaped, and the ``.`` of ``www.``, so that GFM's extended
  autolinks (``https://…``, ``www.…``, ``a@b.c``) cannot turn text into a link.

:func:`md_code` is the inline-code counterpart for text we show verbatim (hashes,
commands): its backtick fence is longer than any backtick run inside, and ``|`` is
escaped as GFM requires inside table cells.
"""

from __future__ import annotations

import re
import unicodedata

_BACKSLASHED = frozenset("\\`*_[]#!|~$:@")
_ENTITIES = {"<": "&lt;", ">": "&gt;", "&": "&amp;"}
_WWW = re.compile(r"(www)\\?\.", re.IGNORECASE)


def flatten(text: object) -> str:
    """``str(text)`` with every control, line- or paragraph-separator character as a space."""
    out = []
    for char in str(text).replace("\r\n", "\n"):
        category = unicodedata.category(char)
        out.append(" " if category in ("Cc", "Zl", "Zp") else char)
    return "".join(out)


def md_text(text: object) -> str:
    """``text`` as literal markdown text: it renders as itself and cannot break a table."""
    out = []
    for char in flatten(text):
        if char in _ENTITIES:
            out.append(_ENTITIES[char])
        elif char in _BACKSLASHED:
            out.append("\\" + char)
        else:
            out.append(char)
    return _WWW.sub(r"\1\\.", "".join(out))


def md_code(text: object) -> str:
    """``text`` as an inline code span that is safe inside a GFM table cell."""
    flat = flatten(text).replace("|", "\\|")
    longest = max((len(run) for run in re.findall(r"`+", flat)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if flat.startswith("`") or flat.endswith("`") or not flat.strip() else ""
    return f"{fence}{pad}{flat}{pad}{fence}"


def md_fence(text: str) -> str:
    """The backtick fence for a fenced code block containing ``text`` (at least three)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)

"""The commands durable prints for a person to copy and paste (``durable show ID``, a
replay's hint, ``durable resume WORKFLOW``): built here, in one place, every word quoted
for a POSIX shell (:func:`shlex.quote`) where it needs it. A run id is any printable text: a
space, a ``$``, a quote or a ``;`` in it, pasted unquoted, would name another run, expand a
variable or run something else."""

from __future__ import annotations

import shlex


def command(*words: object, python: bool = False) -> str:
    """``durable WORD ...`` (``python -m durable WORD ...`` with ``python``), each word
    quoted as a shell needs (a plain word, an option or a number stays as it is)."""
    head = "python -m durable" if python else "durable"
    return " ".join([head, *(shlex.quote(str(word)) for word in words)])

"""Text as a terminal should show it: what a job, a replica or an engine wrote, never acted on."""

from __future__ import annotations


def printable(text: str) -> str:
    """``text`` on one line with what a terminal would act on (escape sequences, BEL, CR, ...) written as escapes.

    For anything a user's program or a remote engine chose (a metric's name, a timer's scope, a pod's message)
    that tsm prints: whitespace runs become one space, every other unprintable character its ``\\x..`` escape.
    """
    return escaped(" ".join(text.split()))


def escaped(text: str, keep: str = "") -> str:
    """``text`` with every unprintable character but those in ``keep`` written as its escape (``\\x1b``,
    ``\\r``, ``\\n``): for text whose spacing matters (a log line keeps its tabs)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else repr(c)[1:-1] for c in text)

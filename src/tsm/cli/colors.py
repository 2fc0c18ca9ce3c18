"""TorchX's ``cli.colors``: ANSI colour codes, empty strings unless stdout is a terminal.

Tools built on TorchX (NeMo-Run) colour their log prefixes with ``GREEN ... ENDC``; piped output stays plain.
"""

from __future__ import annotations

import sys

_TTY = not sys.stdout.closed and sys.stdout.isatty()

GREEN = "\033[32m" if _TTY else ""
BLUE = "\033[34m" if _TTY else ""
ORANGE = "\033[38:2:238:76:44m" if _TTY else ""
GRAY = "\033[2m" if _TTY else ""
ENDC = "\033[0m" if _TTY else ""

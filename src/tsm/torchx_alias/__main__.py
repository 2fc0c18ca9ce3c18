"""``python -m tsm.torchx_alias ...``: see :mod:`tsm.torchx_alias`."""

import sys

from tsm.torchx_alias import main

sys.exit(main())

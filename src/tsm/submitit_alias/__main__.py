"""``python -m tsm.submitit_alias``: see :mod:`tsm.submitit_alias`."""

import sys

import tsm.submitit_alias as _alias

sys.exit(_alias.ALIAS.main(doc=_alias.__doc__ or ""))

"""``tsm serve``: the web dashboard (Starlette app in :mod:`tsm.views.web.app`, static page in ``static/``)."""

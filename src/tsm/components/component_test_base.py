"""``ComponentTestCase``: a :class:`unittest.TestCase` for testing your own components (TorchX's helper).

A component is a plain function, so its logic can be unit-tested like any code. What such a test misses is
whether the *command line* can use it: every parameter annotated with a supported type, a docstring the
help can show, a return annotation of AppDef. :meth:`ComponentTestCase.validate` checks exactly what
``tsm run path/file.py:function --help`` needs; :meth:`ComponentTestCase.run_component` runs the component
on a real scheduler (the local one by default) and returns its final status::

    import unittest
    from tsm.components.component_test_base import ComponentTestCase
    import my_components

    class MyComponentTest(ComponentTestCase):
        def test_train(self) -> None:
            self.validate(my_components, "train")

        def test_train_runs(self) -> None:
            status = self.run_component(my_components.train, {"epochs": 1}, timeout=60)
            assert status is not None and status.state == tsm.AppState.SUCCEEDED

Each test gets a fresh temporary folder, ``self.test_dir`` (removed afterwards), for files it writes; the
working directory stays the test's own, so a component naming a script relative to it (``train.py``)
finds it, as it would on the command line. :meth:`run_component` runs on ``local_cwd`` by default (TorchX's
default: the image name is ignored, replicas run in the working directory), and ``scheduler_params`` go to
the scheduler's factory (TorchX's ``cache_size`` is accepted there). Unlike TorchX's helper, an app that
:meth:`run_component` started and that is still running when the test ends is cancelled then, so a test
that times out leaves no process behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import unittest
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tsm.specs.api import AppDef, AppStatus


class ComponentTestCase(unittest.TestCase):
    """A TestCase with :meth:`validate` and :meth:`run_component` for component functions."""

    test_dir: str

    def setUp(self) -> None:
        """Make ``self.test_dir``, a scratch folder for the test (the working directory stays as it is)."""
        super().setUp()
        self.test_dir = tempfile.mkdtemp(prefix="tsm_component_test_")
        self._launched: list[tuple[Any, str]] = []

    def tearDown(self) -> None:
        """Cancel what :meth:`run_component` left running, remove ``self.test_dir``."""
        try:
            for runner, handle in self._launched:
                status = runner.status(handle)
                if status is not None and not status.is_terminal():
                    runner.cancel(handle)
                runner.close()
        finally:
            shutil.rmtree(self.test_dir, ignore_errors=True)
            super().tearDown()

    def validate(self, module: ModuleType, function_name: str) -> None:
        """Fail unless ``function_name`` of ``module`` is a component the CLI can use.

        Looks it up as ``tsm run /abs/path/module.py:function_name`` would (which refuses unsupported
        parameters), lints the file (errors fail the test; documentation warnings do not) and renders its
        ``--help``.
        """
        from tsm.components.cmdline import component_help
        from tsm.components.finder import get_component
        from tsm.components.linter import ERROR, lint

        path = getattr(module, "__file__", None)
        self.assertIsNotNone(path, f"module {module.__name__} has no file to validate")
        path = os.path.abspath(str(path))
        errors = [f"line {m.line}: {m.description}" for m in lint(path, function_name) if m.severity == ERROR]
        self.assertEqual([], errors, f"{path}:{function_name} is not a valid component")
        comp = get_component(f"{path}:{function_name}")
        self.assertIn("usage:", component_help(comp.fn, prog=f"tsm run {path}:{function_name}"))

    def run_component(
        self,
        component: Callable[..., AppDef],
        args: Mapping[str, Any] | None = None,
        scheduler_params: Mapping[str, Any] | None = None,
        scheduler: str = "local_cwd",
        interval: float = 0.1,
        timeout: float = 1,
    ) -> AppStatus | None:
        """Run ``component(**args)`` on ``scheduler``; return its status once final or after ``timeout`` s.

        ``scheduler_params`` go to the scheduler factory (as ``get_runner(**scheduler_params)``).
        ``interval`` bounds how often a backend without events is asked; the local scheduler reports the
        end as it happens. The status returned may still be running when ``timeout`` is reached; the app is
        then cancelled when the test ends.
        """
        from tsm.runner.api import get_runner

        app = component(**dict(args or {}))
        runner = get_runner(None, None, **dict(scheduler_params or {}))
        handle = runner.run(app, scheduler)
        self._launched.append((runner, handle))
        runner.wait(handle, wait_interval=interval, timeout=timeout)
        return runner.status(handle)

"""Run TorchX 0.7.0's own unit tests, unchanged, on tsm through ``python -m tsm.torchx_alias``; print the count.

    python tests/compat/torchx/upstream.py [--tests DIR] [--timeout SECONDS]

``DIR`` holds TorchX's test files at their TorchX paths (``DIR/torchx/specs/test/api_test.py``, ...), read in
place, never copied or edited. Each of the 13 modules runs in its own process under the alias (every
``import torchx...`` that is not a file of ``DIR`` is tsm's), with a fresh ``TSM_HOME``, ``HOME`` and config
folder, and each test under a time limit (a test past it fails). The last line is::

    TorchX 0.7.0's own tests: N passed, N failed, N not applicable

and the exit status is 1 when any test failed (0 otherwise). :data:`NOT_APPLICABLE` lists the tests that check
something of TorchX's own making rather than its contract, each with the reason; they run too, and one that
passes is reported as a failure, so the list cannot go stale. A missing ``DIR`` is a failure when ``CI=true``,
else a skip line (exit 0).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

#: The reference set: TorchX 0.7.0's tests of its public specs / runner / scheduler-API / components surface.
MODULES = (
    "specs.test.api_test", "specs.test.builders_test", "specs.test.file_linter_test", "specs.test.finder_test",
    "specs.test.named_resources_test", "specs.test.named_resources_generic_test", "specs.test.named_resources_aws_test",
    "runner.test.api_test", "runner.test.config_test", "schedulers.test.api_test", "schedulers.test.registry_test",
    "components.test.utils_test", "components.test.dist_test",
)

#: ``module:Class.test`` -> why it does not apply to tsm (a TorchX internal, or a rule tsm keeps on purpose).
NOT_APPLICABLE: dict[str, str] = {
    "specs.test.api_test:AppDefStatusTest.test_format_error_message":
        "calls AppStatus._format_error_message, a private helper of TorchX's AppStatus.format()",
    "specs.test.finder_test:FinderTest.test_load_builtin_echo":
        "compares the echo builtin's description with the wording of TorchX's own docstring",
    "components.test.dist_test:DDPTest.test_ddp_rdzv_backend_static":
        "reads torchrun's options out of TorchX's `bash -c` string (args[1]); tsm's ddp runs no shell and passes "
        "each value as its own argument",
    "runner.test.api_test:RunnerTest.test_dryrun_with_workspace":
        "its app has two roles named 'sleep'; tsm refuses a role name used twice on every path (it keys the "
        "role's logs, containers and job steps)",
}

SUMMARY = "TorchX 0.7.0's own tests: {passed} passed, {failed} failed, {na} not applicable"


class TestTimeout(BaseException):
    """A test ran past its time limit (a BaseException, so a test's own ``except Exception`` cannot hide it)."""


def _tests(suite: unittest.TestSuite | unittest.TestCase) -> Iterator[unittest.TestCase]:
    if isinstance(suite, unittest.TestCase):
        yield suite
        return
    for item in suite:
        yield from _tests(item)


def _test_id(module: str, test: unittest.TestCase) -> str:
    cls = type(test)
    return f"{module}:{cls.__qualname__}.{test._testMethodName}"


def child(module: str, report: Path, timeout: float) -> int:
    """In the alias's process: run ``torchx.<module>``'s tests one by one, each under ``timeout`` seconds."""

    def expire(signum: int, frame: object) -> None:
        raise TestTimeout(f"the test ran longer than its {timeout:g} s limit")

    signal.signal(signal.SIGALRM, expire)
    results: dict[str, str] = {}
    suite = unittest.defaultTestLoader.loadTestsFromName(f"torchx.{module}")
    for test in _tests(suite):
        result = unittest.TestResult()  # one result per test: a verdict each
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            test(result)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        name = _test_id(module, test) if not isinstance(test, unittest.loader._FailedTest) else f"{module}:<import>"
        ok = result.wasSuccessful() and not result.skipped
        results[name] = "passed" if ok else "failed"
        for kind, problems in (("FAIL", result.failures), ("ERROR", result.errors)):
            for _, trace in problems:
                print(f"\n{kind}: {name}\n{trace}", flush=True)
        for _, why in result.skipped:
            print(f"\nSKIPPED (counted as failed): {name}: {why}", flush=True)
        report.write_text(json.dumps(results))
    return 0


def _environment(home: Path, tests: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TSM_", "TORCHX"))}
    for name in ("home", "config", "tsm-home"):
        (home / name).mkdir()
    env.update(HOME=str(home / "home"), XDG_CONFIG_HOME=str(home / "config"), TSM_HOME=str(home / "tsm-home"),
               PYTHONPATH=os.pathsep.join([str(tests), str(ROOT / "src")]), PYTHONDONTWRITEBYTECODE="1")
    return env


def run_module(module: str, tests: Path, timeout: float, python: str) -> tuple[dict[str, str], str]:
    """Run one module in a process of its own; ``({test id: passed|failed}, its output)``."""
    with tempfile.TemporaryDirectory(prefix="tsm-torchx-tests-") as tmp:
        work = Path(tmp)
        report = work / "report.json"
        cmd = [python, "-m", "tsm.torchx_alias", __file__, "--child", module, "--report", str(report),
               "--timeout", str(timeout)]
        proc = subprocess.Popen(cmd, cwd=work, env=_environment(work, tests), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout * 40 + 120)  # the per-test limit is the child's to keep
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            out += f"\n{module}: the module's process ran past its limit and was killed\n"
        results = json.loads(report.read_text()) if report.exists() else {}
        if proc.returncode != 0 or not results:
            results[f"{module}:<process>"] = "failed"
            out += f"\n{module}: its process exited with status {proc.returncode}\n"
    return results, out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--tests", type=Path, default=ROOT.parent / "shared" / "torchx-0.7.0-tests")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds each test may take")
    p.add_argument("--module", action="append", help="run this module of DIR instead of the 13 (repeatable)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--report", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args.child, args.report, args.timeout)
    tests = args.tests.resolve()
    if not (tests / "torchx").is_dir():
        if os.environ.get("CI", "").lower() == "true":
            print(f"TorchX 0.7.0's own tests: FAILED: no test folder at {tests} (CI=true: it must be there)")
            return 1
        print(f"TorchX 0.7.0's own tests: skipped: no test folder at {tests} (give TORCHX_TESTS=DIR to run them)")
        return 0
    passed = failed = na = 0
    stale: list[str] = []
    started = time.monotonic()
    for module in args.module or MODULES:
        results, out = run_module(module, tests, args.timeout, sys.executable)
        counts = {"passed": 0, "failed": 0, "not applicable": 0}
        for test, verdict in results.items():
            if test in NOT_APPLICABLE:
                counts["not applicable"] += 1
                if verdict == "passed":
                    stale.append(test)
            else:
                counts[verdict] += 1
        if counts["failed"]:
            print(out.rstrip())
        print(f"  {module}: " + ", ".join(f"{n} {what}" for what, n in counts.items()), flush=True)
        passed, failed, na = passed + counts["passed"], failed + counts["failed"], na + counts["not applicable"]
    for test in stale:
        print(f"listed as not applicable but it passes (remove it from NOT_APPLICABLE): {test}")
    for test, why in NOT_APPLICABLE.items():
        print(f"  not applicable: {test}: {why}")
    print(f"  ({time.monotonic() - started:.0f} s)")
    print(SUMMARY.format(passed=passed, failed=failed + len(stale), na=na - len(stale)))
    return 1 if failed or stale else 0


if __name__ == "__main__":
    sys.exit(main())

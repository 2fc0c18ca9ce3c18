"""An incompatible client stack (issue 30 item 8) is named in one line with the fix, before any call fails."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tsm.errors import SchedulerUnavailableError
from tsm.schedulers.common import compat_check

#: urllib3 1.25's PoolKey fields (what TorchX 0.7's pin installs): no key_ca_cert_data
OLD_FIELDS = ("key_scheme", "key_host", "key_port", "key_timeout", "key_retries", "key_strict", "key_block",
              "key_source_address", "key_key_file", "key_cert_file", "key_cert_reqs", "key_ca_certs",
              "key_ssl_version", "key_ca_cert_dir", "key_ssl_context", "key_maxsize", "key_headers",
              "key__proxy", "key__proxy_headers", "key_socket_options", "key__socks_options",
              "key_assert_hostname", "key_assert_fingerprint", "key_server_hostname")


def test_installed_stack_is_compatible() -> None:
    assert compat_check.kubernetes_client_problem() is None
    compat_check.check_kubernetes_client()


def test_old_urllib3_is_named_with_the_fix_in_one_line() -> None:
    problem = compat_check.kubernetes_client_problem(OLD_FIELDS)
    assert problem is not None and "\n" not in problem
    assert "urllib3" in problem and "ca_cert_data" in problem and "pip install -U 'urllib3>=1.26'" in problem


def test_the_check_is_the_real_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fields it reads are the ones whose absence makes the Kubernetes client fail with PoolKey's TypeError."""
    import urllib3.poolmanager as pm

    old = pm.PoolKey
    narrowed = __import__("collections").namedtuple("PoolKey", [f for f in old._fields if f != "key_ca_cert_data"])
    with pytest.raises(TypeError, match="key_ca_cert_data"):
        narrowed(**{f: None for f in old._fields})
    monkeypatch.setattr(pm, "PoolKey", narrowed)
    with pytest.raises(SchedulerUnavailableError, match="urllib3"):
        compat_check.check_kubernetes_client()


def test_importing_the_check_loads_no_client_library() -> None:
    code = ("import sys, tsm.schedulers.common.compat_check; "
            "print(any(m.split('.')[0] in ('urllib3', 'kubernetes') for m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False", r.stderr

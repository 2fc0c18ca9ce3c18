"""A backend without its extra names the ``pip install`` line (issue 45), against the real engine: a Ray run packs the
job's code with Ray's own packaging on this host, so without ``ray`` here it stops there, before anything is
submitted, with one line (the fast suite checks the same against the Ray client's fake dashboard).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .ray_cluster import RayCluster

HANG = 300  # seconds: a guard against a hung command, never a performance claim


@pytest.mark.integration
@pytest.mark.ray
def test_ray_run_without_ray_installed_here_says_which_pip_install_to_run(ray_cluster: RayCluster, tmp_path: object) -> None:
    code = "import sys\nsys.modules['ray'] = None\nfrom tsm.cli.main import main\nsys.exit(main(sys.argv[1:]))\n"
    r = subprocess.run([sys.executable, "-c", code, "run", "-s", "ray", "-c", f"address={ray_cluster.address}",
                        "utils.echo"], capture_output=True, text=True, timeout=HANG, stdin=subprocess.DEVNULL,
                       cwd=str(tmp_path), env=dict(os.environ))
    assert r.returncode == 1
    assert r.stderr == "error: the ray scheduler needs the Python package 'ray': pip install 'tsm[ray]'\n"

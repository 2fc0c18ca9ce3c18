"""CLI start-up and the shortest round trip: `import tsm`, `tsm --help`, `tsm run utils.echo --msg hi`.

Targets (2-core machine, medians): import tsm <= 50 ms, tsm --help <= 60 ms, tsm run utils.echo <= 150 ms
end to end with the output printed every time (50 runs in a row).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _util import emit, median_of, private_home, timed  # noqa: E402

BIN = Path(sys.executable).parent
TSM = str(BIN / "tsm")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", "--smoke", action="store_true", help="tiny sizes: checks that the benchmark still runs")
    runs = 2 if ap.parse_args().tiny else 20
    private_home()
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # measure what users run: cached bytecode (see perf_targets)
    env = dict(os.environ, PATH=f"{BIN}:{os.environ.get('PATH', '')}")
    run = lambda *cmd: subprocess.run(list(cmd), env=env, capture_output=True, check=True)  # noqa: E731
    run(sys.executable, "-c", "import tsm")  # warm the file cache and .pyc files
    emit("python -c pass", **median_of(lambda: timed(lambda: run(sys.executable, "-c", "pass")), runs))
    emit("import tsm", target="median <= 50 ms",
         **median_of(lambda: timed(lambda: run(sys.executable, "-c", "import tsm")), runs))
    run(TSM, "--help")
    emit("tsm --help", target="median <= 60 ms", **median_of(lambda: timed(lambda: run(TSM, "--help")), runs))
    run(TSM, "run", "utils.echo", "--msg", "hi")
    missing = 0

    def once() -> float:
        nonlocal missing
        t = timed(lambda: None)
        out = None

        def go() -> None:
            nonlocal out
            out = run(TSM, "run", "utils.echo", "--msg", "hi").stdout

        t = timed(go)
        if out != b"echo/0 hi\n":
            missing += 1
        return t

    figures = median_of(once, 50 if runs == 20 else 2)
    emit("tsm run utils.echo --msg hi", target="median <= 150 ms, output printed 50/50", output_missing=missing, **figures)


if __name__ == "__main__":
    main()

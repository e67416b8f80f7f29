#!/usr/bin/env python3
"""What the STREAMALLOC_ENABLE .pth costs at interpreter start: `python -c pass` timed N times each way.

    python3 bench/studies/pth_overhead.py [--runs 200] [--json out.json]

Three ways, each from a virtual environment that sees this machine's packages (as a user's venv with
torch would): without the .pth; with it installed and the switch unset (what every other Python
process of the machine pays); with it installed and STREAMALLOC_ENABLE=1 (the hook module loads,
torch is not imported). Runs are interleaved (the order rotates each round) so that drift of a busy
machine hits every way alike; each way's median and quartiles are printed, of the wall time and of the
CPU time (user + system) of the child, which a busy machine disturbs less. The package comes from
this repository's torch_plugin/ (PYTHONPATH), as in the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PTH = REPO / "torch_plugin" / "streamalloc" / "streamalloc-autoenable.pth"


def make_venv(root: Path, with_pth: bool) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    if with_pth:
        purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 check=True, capture_output=True, text=True).stdout.strip()
        shutil.copy(PTH, Path(purelib) / PTH.name)
    return python


def environment(switch: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("STREAMALLOC_ENABLE", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "torch_plugin"), env.get("PYTHONPATH", "")) if p)
    if switch:
        env["STREAMALLOC_ENABLE"] = "1"
    return env


def time_once(python: Path, env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one `python -c pass`."""
    start = time.perf_counter()
    child = subprocess.Popen([str(python), "-c", "pass"], env=env)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"{python} -c pass exited {child.returncode}")
    return wall, usage.ru_utime + usage.ru_stime


def quartiles(samples: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(samples, n=4)
    return q[0], statistics.median(samples), q[2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="interpreter starts per way (default 200)")
    parser.add_argument("--json", help="write the medians and quartiles here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        plain = make_venv(Path(tmp) / "plain", with_pth=False)
        pth = make_venv(Path(tmp) / "pth", with_pth=True)
        ways = {
            "no .pth": (plain, environment(False)),
            ".pth, switch unset": (pth, environment(False)),
            ".pth, STREAMALLOC_ENABLE=1": (pth, environment(True)),
        }
        for python, env in ways.values():  # warm the file cache
            time_once(python, env)
        samples: dict[str, dict[str, list[float]]] = {name: {"wall": [], "cpu": []} for name in ways}
        names = list(ways)
        for i in range(args.runs):
            for name in names[i % len(names):] + names[:i % len(names)]:
                wall, cpu = time_once(*ways[name])
                samples[name]["wall"].append(wall)
                samples[name]["cpu"].append(cpu)

    print(f"python -c pass, {args.runs} starts per way, interleaved; Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    result = {"runs": args.runs, "python": platform.python_version(), "cpus": os.cpu_count(), "ways": {}}
    for kind in ("wall", "cpu"):
        base = statistics.median(samples["no .pth"][kind])
        print(f" {kind} time:")
        for name in ways:
            q1, median, q3 = quartiles(samples[name][kind])
            result["ways"].setdefault(name, {})[kind] = {
                "median_ms": median * 1e3, "q1_ms": q1 * 1e3, "q3_ms": q3 * 1e3}
            print(f"  {name:28s} median {median * 1e3:8.2f} ms  (quartiles {q1 * 1e3:.2f}-{q3 * 1e3:.2f})  "
                  f"{(median - base) * 1e3:+.2f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

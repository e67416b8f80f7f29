"""Shared helpers of the Python tests: what this machine can run, and running Python in a subprocess
(the CUDA allocator is chosen once per process, so every test that enables streamalloc or touches
CUDA runs its body in a fresh interpreter)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from streamalloc import _native

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"
REPO = HERE.parents[1]
EXAMPLES = REPO / "examples"

try:
    import torch

    HAS_TORCH = True
    CUDA_DEVICES = torch.cuda.device_count() if torch.cuda.is_available() else 0
except ImportError:
    HAS_TORCH = False
    CUDA_DEVICES = 0

HAS_C_LIBRARY = _native.find_c_library() is not None
HAS_EXTENSION = _native.find_extension() is not None

requires_torch = pytest.mark.skipif(not HAS_TORCH, reason="PyTorch is not installed")
requires_native = pytest.mark.skipif(
    not HAS_C_LIBRARY,
    reason="libstreamalloc.so not found: build the repository and set STREAMALLOC_LIBRARY_DIR"
    " (or STREAMALLOC_BUILD_DIR)")
requires_extension = pytest.mark.skipif(
    not HAS_EXTENSION,
    reason="the LibTorch extension (_torch_ext) was not built: configure with LibTorch on CMAKE_PREFIX_PATH")
requires_cuda = pytest.mark.skipif(
    CUDA_DEVICES < 1, reason="needs a CUDA device (torch.cuda.is_available() is False)")
requires_two_gpus = pytest.mark.skipif(CUDA_DEVICES < 2, reason=f"needs 2 CUDA devices, found {CUDA_DEVICES}")


def run_python(args: list[str], *, env: dict[str, str] | None = None, cwd: str | Path | None = None,
               timeout: float = 300, check: bool = False) -> subprocess.CompletedProcess:
    """Run `python args...` with the test environment (PYTHONPATH, STREAMALLOC_LIBRARY_DIR) plus `env`."""
    full_env = dict(os.environ)
    full_env.pop("STREAMALLOC_CONF", None)  # each test says what it wants
    full_env.update(env or {})
    result = subprocess.run([sys.executable, *args], env=full_env, cwd=cwd, capture_output=True, text=True,
                            timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"python {' '.join(args)} exited {result.returncode}\n--- stdout\n{result.stdout}"
                             f"\n--- stderr\n{result.stderr}")
    return result


def run_code(code: str, **kwargs) -> subprocess.CompletedProcess:
    return run_python(["-c", code], **kwargs)


def last_json(result: subprocess.CompletedProcess) -> dict:
    """The JSON object a helper script printed on its last stdout line."""
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no JSON result; stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return json.loads(lines[-1])


class ProbeRun:
    """One run of a GPU probe script (scripts/*_probe.py): its JSON result (None if it printed none),
    stdout, stderr and exit status. The probes report named behaviours (or sections) under `group`,
    each as its facts or as {"error": traceback}."""

    def __init__(self, argv: list[str], result: subprocess.CompletedProcess, group: str = "behaviours"):
        self.argv = argv
        self.group = group
        self.returncode = result.returncode
        self.stdout = result.stdout
        self.stderr = result.stderr
        try:
            self.out = last_json(result)
        except (AssertionError, ValueError):
            self.out = None

    def tails(self) -> str:
        return (f"{' '.join(self.argv)} exited {self.returncode}\n--- stdout (tail)\n{self.stdout[-3000:]}"
                f"\n--- stderr (tail)\n{self.stderr[-6000:]}")

    def result(self) -> dict:
        assert self.returncode == 0 and self.out is not None, self.tails()
        return self.out

    def facts(self, name: str) -> dict:
        """What one behaviour reported; fails with its traceback and the child's stderr if it raised."""
        group = self.result()[self.group]
        assert name in group, f"{name!r} missing\n{self.tails()}"
        facts = group[name]
        if isinstance(facts, dict) and isinstance(facts.get("error"), str):
            pytest.fail(f"{name} raised under {self.out.get('allocator')}:\n{facts['error']}\n{self.tails()}")
        return facts


def run_probe(script: str, allocator: str, args: tuple = (), group: str = "behaviours",
              timeout: float = 300) -> ProbeRun:
    """scripts/SCRIPT under PyTorch's allocator ("native"), under streamalloc's extension path
    ("streamalloc", `python -m streamalloc`), or with the script's own `--stock` flag ("stock")."""
    argv = [str(SCRIPTS / script), *args]
    env = {}
    if allocator == "streamalloc":
        argv = ["-m", "streamalloc", *argv]
        env["STREAMALLOC_TORCH_PATH"] = "extension"
    elif allocator == "stock":
        argv = [*argv, "--stock"]
    run = ProbeRun(argv, run_python(argv, env=env, timeout=timeout), group)
    if run.out is not None and allocator in ("native", "streamalloc"):
        expected = "extension" if allocator == "streamalloc" else "native"
        assert run.out["allocator"] == expected, run.tails()
    return run


@functools.lru_cache(maxsize=None)
def contract_probe(allocator: str) -> ProbeRun:
    """scripts/contract_probe.py under `allocator`, run once per pytest process: test_gpu_contract.py
    and test_gpu_history.py both read its facts (one process, graph work first, as a suite runs)."""
    return run_probe("contract_probe.py", allocator, timeout=900)

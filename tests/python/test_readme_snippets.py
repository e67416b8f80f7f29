"""The README's code blocks run as written.

Each ```python block runs in a fresh interpreter (streamalloc from the source tree, its native
library from the build); each ```cpp block is compiled against allocator/include, linked with the
built libstreamalloc.so and run (on the simulated device here, on the GPU where there is one).
Shell blocks (make targets, pip install) are covered by the build and CI, not here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from support import HAS_TORCH, REPO, requires_native, run_code

README = REPO / "README.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(language: str) -> list[str]:
    return [body for lang, body in BLOCK.findall(README.read_text()) if lang == language]


def test_the_readme_has_the_blocks_these_tests_run():
    assert len(blocks("python")) >= 1 and len(blocks("cpp")) >= 1


@pytest.mark.parametrize("index", range(len(blocks("python"))))
@requires_native
def test_python_block_runs(index):
    if not HAS_TORCH:
        pytest.skip("the README's Python snippet enables streamalloc, which needs PyTorch")
    import torch

    if torch.version.cuda is None:
        pytest.skip("the README's Python snippet needs a CUDA build of PyTorch (enable() refuses a CPU build)")
    code = blocks("python")[index]
    result = run_code(code)
    assert result.returncode == 0, f"README python block {index} failed:\n{code}\n--- stderr\n{result.stderr}"


def compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def library_dir() -> Path | None:
    for entry in os.environ.get("STREAMALLOC_LIBRARY_DIR", "").split(os.pathsep):
        if entry and (Path(entry) / "libstreamalloc.so").is_file():
            return Path(entry)
    return None


@pytest.mark.parametrize("index", range(len(blocks("cpp"))))
def test_cpp_block_compiles_links_and_runs(index, tmp_path):
    cxx, lib = compiler(), library_dir()
    if cxx is None:
        pytest.skip("no C++ compiler (c++, g++ or clang++) on PATH")
    if lib is None:
        pytest.skip("libstreamalloc.so not built: build the repository and set STREAMALLOC_LIBRARY_DIR")
    source = tmp_path / f"readme_{index}.cpp"
    source.write_text(blocks("cpp")[index])
    program = tmp_path / f"readme_{index}"
    build = subprocess.run([cxx, "-std=c++17", "-Wall", "-Werror", f"-I{REPO / 'allocator' / 'include'}",
                            str(source), "-o", str(program), f"-L{lib}", "-lstreamalloc", f"-Wl,-rpath,{lib}"],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, f"README C++ block {index} does not build:\n{build.stderr}"
    env = dict(os.environ)
    env.pop("STREAMALLOC_CONF", None)
    run = subprocess.run([str(program)], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, f"README C++ block {index} exited {run.returncode}:\n{run.stdout}\n{run.stderr}"
    assert "Per-block stream report" in run.stdout

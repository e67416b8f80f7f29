"""STREAMALLOC_ENABLE=1: the .pth line that the installed package puts into site-packages.

The tests make a virtual environment that sees this machine's packages (torch), drop the package's
streamalloc-autoenable.pth into its site-packages as `pip install ./torch_plugin` does, and start
interpreters from it, so the .pth runs at startup exactly as in an installed environment; the package
itself comes from the source tree (PYTHONPATH, set by conftest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support import REPO, requires_cuda, requires_native, requires_torch

PTH = REPO / "torch_plugin" / "streamalloc" / "streamalloc-autoenable.pth"


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(root)],
                   check=True, capture_output=True)
    python = root / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    (Path(purelib) / PTH.name).write_text(PTH.read_text())
    # --system-site-packages gives the base interpreter's site-packages only: when the tests run from a
    # virtual environment (where torch may be installed), its site-packages are added by a path file.
    import site

    parent_sites = [p for p in site.getsitepackages() + [site.getusersitepackages()] if os.path.isdir(p)]
    (Path(purelib) / "000-parent-site-packages.pth").write_text("\n".join(parent_sites) + "\n")
    return python


def run_in(python: Path, code: str | None, switch: str | None, conf: str | None = None,
           timeout: float = 300, args: list[str] | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    for name in ("STREAMALLOC_ENABLE", "STREAMALLOC_CONF"):
        env.pop(name, None)
    if switch is not None:
        env["STREAMALLOC_ENABLE"] = switch
    if conf is not None:
        env["STREAMALLOC_CONF"] = conf
    argv = args if code is None else ["-c", textwrap.dedent(code)]
    return subprocess.run([str(python), *argv], env=env, capture_output=True, text=True,
                          timeout=timeout)


LOADED = ("import sys, json; print(json.dumps(sorted(m for m in sys.modules"
          " if m.split('.')[0] in ('streamalloc', 'torch'))))")


def test_the_pth_is_one_import_line_that_checks_the_environment_itself():
    lines = [line for line in PTH.read_text().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("import os;")
    assert "STREAMALLOC_ENABLE" in lines[0] and "streamalloc._autoenable" in lines[0]


def test_the_package_build_installs_the_pth_at_the_top_of_site_packages():
    cmake = (REPO / "torch_plugin" / "CMakeLists.txt").read_text()
    assert f"install(FILES streamalloc/{PTH.name} DESTINATION . COMPONENT python)" in cmake


@pytest.mark.parametrize("switch", [None, "", "0"])
def test_without_the_switch_nothing_of_streamalloc_is_imported(venv_python, switch):
    result = run_in(venv_python, LOADED, switch)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


def test_with_the_switch_only_the_hook_loads_and_torch_is_not_imported(venv_python):
    result = run_in(venv_python, LOADED + "\nimport streamalloc._autoenable as a; print(a.outcome())", "1")
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout.splitlines()[0])
    assert "streamalloc._autoenable" in loaded
    assert not any(m == "torch" or m.startswith("torch.") for m in loaded)
    assert result.stdout.splitlines()[1] == "None"  # torch not imported: nothing attempted yet
    assert result.stderr == ""


PROBE = """
    import torch
    import streamalloc, streamalloc._autoenable as auto
    print(auto.outcome())
    print(streamalloc.is_enabled(), streamalloc.enabled_conf(), torch.cuda.is_initialized())
"""


@requires_torch
@requires_native
def test_importing_torch_enables_streamalloc_with_the_conf_from_the_environment(venv_python):
    import torch

    result = run_in(venv_python, PROBE, "1", conf="audit:warn")
    assert result.returncode == 0, result.stderr
    outcome, state = result.stdout.splitlines()[:2]
    if torch.version.cuda is None:  # a CPU build of torch: the hook ran and says why it could not enable
        assert outcome.startswith("failed: ") and "needs a CUDA build of PyTorch" in outcome
        assert "STREAMALLOC_ENABLE is set but streamalloc was not enabled" in result.stderr
        return
    assert outcome == "enabled", result.stderr
    enabled, conf, cuda_initialised = state.split(" ", 2)
    assert enabled == "True" and "audit:warn" in conf
    assert cuda_initialised == "False"  # enabling did no CUDA work


@requires_torch
@requires_native
def test_a_bad_conf_is_reported_and_does_not_break_import_torch(venv_python):
    result = run_in(venv_python, PROBE, "1", conf="no_such_key:1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].startswith("failed: ")
    assert "no_such_key" in result.stderr and "STREAMALLOC_ENABLE is set" in result.stderr


@requires_torch
@requires_native
def test_explicit_enable_with_the_same_options_is_a_no_op(venv_python):
    result = run_in(venv_python, """
        import torch, streamalloc, streamalloc._autoenable as auto
        if auto.outcome() == "enabled":
            streamalloc.enable()
        print(auto.outcome())
    """, "1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] in ("enabled", "failed:")


@requires_torch
@requires_native
def test_an_explicit_enable_that_imports_torch_keeps_its_own_options(venv_python):
    import torch

    if torch.version.cuda is None:
        pytest.skip("enable() needs a CUDA build of PyTorch")
    result = run_in(venv_python, """
        import streamalloc, streamalloc._autoenable as auto
        streamalloc.enable(audit="warn")   # imports torch: the switch leaves the installing to this call
        print(auto.outcome(), "audit:warn" in streamalloc.enabled_conf())
    """, "1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["explicit", "True"]


SPAWN = """
    import multiprocessing as mp

    def child(queue):
        import torch, streamalloc, streamalloc._autoenable as auto
        x = torch.ones(1 << 20, device="cuda")
        torch.cuda.synchronize()
        queue.put((auto.outcome(), streamalloc.active_path(),
                   streamalloc.stats()["memory_stats"].get("allocated_bytes.all.current", 0),
                   len([b for b in streamalloc.blocks() if b["state"] == "active_allocated"])))

    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        p = ctx.Process(target=child, args=(queue,))
        p.start()
        import queue as q
        for _ in range(240):  # a child that dies without an answer ends the wait at once
            try:
                print(queue.get(timeout=1))
                break
            except q.Empty:
                if not p.is_alive():
                    raise SystemExit(f"the child exited with {p.exitcode} before answering")
        else:
            raise SystemExit("no answer from the child within 240 s")
        p.join()
"""


@requires_torch
@requires_native
@requires_cuda
def test_a_spawned_child_is_served_by_streamalloc(venv_python, tmp_path):
    script = tmp_path / "spawn_probe.py"
    script.write_text(textwrap.dedent(SPAWN))
    result = run_in(venv_python, None, "1", args=[str(script)])
    assert result.returncode == 0, result.stderr
    outcome, path, allocated, active = eval(result.stdout.strip().splitlines()[-1])
    assert outcome == "enabled" and path in ("extension", "c-abi")
    assert allocated >= 4 << 20 and active >= 1



@requires_torch
@requires_native
@pytest.mark.parametrize("env_conf", [None, "poison:free"])
def test_the_launcher_with_its_own_conf_enables_with_it_under_the_switch(venv_python, tmp_path, env_conf):
    """STREAMALLOC_ENABLE=1 and `python -m streamalloc --conf ...`: the launcher's enable imports torch,
    so the switch's hook must leave the installing to it; were the hook to enable first (with
    STREAMALLOC_CONF, or the defaults), the launcher's options would then be refused as different."""
    import torch

    if torch.version.cuda is None:
        pytest.skip("enable() needs a CUDA build of PyTorch")
    script = tmp_path / "launched.py"
    script.write_text(textwrap.dedent(PROBE))
    result = run_in(venv_python, None, "1", conf=env_conf,
                    args=["-m", "streamalloc", "--conf", "audit:warn", str(script)])
    assert result.returncode == 0, result.stderr
    outcome, state = result.stdout.splitlines()[:2]
    assert outcome == "explicit", result.stderr
    enabled, conf, _ = state.split(" ", 2)
    assert enabled == "True" and "audit:warn" in conf
    assert "options differ" not in result.stderr

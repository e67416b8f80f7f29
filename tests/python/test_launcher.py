"""`python -m streamalloc`: runs the program as `python` would, with streamalloc enabled first."""

import json
import textwrap

import pytest
from support import CUDA_DEVICES, requires_native, requires_torch, run_python

pytestmark = [requires_native, requires_torch]

PROBE = textwrap.dedent("""\
    import json, os, sys
    import streamalloc, torch
    print(json.dumps({
        "argv": sys.argv, "name": __name__, "path0": sys.path[0],
        "enabled": streamalloc.is_enabled(), "conf": streamalloc.enabled_conf(),
        "env_conf": os.environ.get("STREAMALLOC_CONF"),
        "cuda_initialized": torch.cuda.is_initialized(),
    }))
    if len(sys.argv) > 1 and sys.argv[1] == "exit":
        sys.exit(int(sys.argv[2]))
    if len(sys.argv) > 1 and sys.argv[1] == "raise":
        raise KeyError("raised by the script")
""")


@pytest.fixture
def probe(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    return script


def launch(*args, **kwargs):
    return run_python(["-m", "streamalloc", *map(str, args)], **kwargs)


def probe_output(result):
    return json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][-1])


def test_script_sees_its_argv_main_and_directory(probe, tmp_path):
    result = launch(probe, "a", "--flag", "-m", "x", cwd="/")
    assert result.returncode == 0, result.stderr
    out = probe_output(result)
    assert out["argv"] == [str(probe), "a", "--flag", "-m", "x"]
    assert out["name"] == "__main__"
    assert out["path0"] == str(tmp_path)  # the script's directory, as `python script.py` gives
    assert out["enabled"]
    # Enabling did no CUDA work: the program can still fork or pick its devices.
    assert not out["cuda_initialized"]


@pytest.mark.parametrize("code", [0, 3, 17])
def test_exit_status_is_the_programs(probe, code):
    result = launch(probe, "exit", code)
    assert result.returncode == code
    assert probe_output(result)["enabled"]


def test_an_uncaught_exception_exits_1_with_its_traceback(probe):
    result = launch(probe, "raise")
    assert result.returncode == 1
    assert "KeyError: 'raised by the script'" in result.stderr


def test_module_mode_runs_like_python_dash_m(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tool.py").write_text(PROBE)
    result = launch("-m", "pkg.tool", "exit", 5, cwd=tmp_path)
    assert result.returncode == 5, result.stderr
    out = probe_output(result)
    assert out["name"] == "__main__"
    assert out["argv"] == [str(package / "tool.py"), "exit", "5"]
    assert out["enabled"]


def test_conf_option_is_applied_and_exported_to_the_program(probe):
    result = launch("--conf", "audit:warn,poison:free", probe)
    assert result.returncode == 0, result.stderr
    out = probe_output(result)
    assert out["env_conf"] == "audit:warn,poison:free"
    assert "audit:warn" in out["conf"] and "poison:free" in out["conf"]


def test_conf_from_the_environment(probe):
    result = launch(probe, env={"STREAMALLOC_CONF": "check_sync:1"})
    assert "check_sync:1" in probe_output(result)["conf"]


def test_bad_conf_stops_before_the_program_runs(tmp_path):
    marker = tmp_path / "ran"
    script = tmp_path / "touch.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    result = launch("--conf", "cross_stream_reuse:sometimes", script)
    assert result.returncode == 2
    assert "bad value 'sometimes' for option 'cross_stream_reuse'" in result.stderr
    assert not marker.exists()


def test_conf_errors_name_the_option_with_one_prefix(tmp_path):
    script = tmp_path / "nothing.py"
    script.write_text("")
    result = launch("--conf", "foo:1", script, env={"STREAMALLOC_CONF": "audit:warn"})
    assert result.returncode == 2
    assert "streamalloc: unknown option 'foo' in --conf;" in result.stderr
    assert "STREAMALLOC_CONF" not in result.stderr
    assert "streamalloc: streamalloc:" not in result.stderr
    result = launch(script, env={"STREAMALLOC_CONF": "foo:1"})
    assert result.returncode == 2
    assert "unknown option 'foo' in STREAMALLOC_CONF;" in result.stderr


def test_the_malformed_item_hint_is_an_item_the_launcher_accepts(probe):
    result = launch("--conf", "check_sync", probe)
    assert result.returncode == 2
    hint = result.stderr.split("e.g. ")[1].split()[0]
    result = launch("--conf", hint, probe)
    assert result.returncode == 0, result.stderr
    assert hint in probe_output(result)["conf"]


@pytest.mark.skipif(CUDA_DEVICES > 0, reason="this machine has a CUDA device")
def test_no_cuda_device_is_said_once(probe):
    result = launch(probe)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("sees no CUDA device") == 1, result.stderr


def test_usage_errors(tmp_path):
    result = launch()
    assert result.returncode == 2 and "no script or -m module" in result.stderr
    result = launch("--frobnicate", "x.py")
    assert result.returncode == 2 and "unknown option --frobnicate" in result.stderr
    result = launch(tmp_path / "missing.py")
    assert result.returncode == 2 and "can't open file" in result.stderr
    result = launch("--help")
    assert result.returncode == 0 and "usage: python -m streamalloc" in result.stdout


def test_report_and_dump_at_exit(probe, tmp_path):
    dump = tmp_path / "dump.json"
    result = launch("--report", "--dump", dump, probe, "exit", 4)
    assert result.returncode == 4  # the report does not change the program's status
    assert "streamalloc (" in result.stderr
    data = json.loads(dump.read_text())
    assert data["path"] in ("extension", "c-abi") and "snapshot" in data
    report = run_python(["-m", "streamalloc.report", str(dump)])
    assert report.returncode == 0, report.stderr
    assert f"streamalloc via {data['path']}" in report.stdout


"""enable() on any machine: option validation, idempotence, path choice, and no CUDA work.

Each case runs in a fresh interpreter, because enabling is once per process."""

import json

import pytest
from streamalloc import _enable
from support import CUDA_DEVICES, HAS_EXTENSION, requires_extension, requires_native, requires_torch, run_code

pytestmark = [requires_native, requires_torch]


def run_enable(body: str, env=None):
    code = "import json, torch, streamalloc\n" + body
    return run_code(code, env=env)


def test_unknown_key_is_named_before_any_cuda_work():
    result = run_enable(
        "try:\n"
        "    streamalloc.enable(audit='warn', bogus_key=1)\n"
        "except ValueError as e:\n"
        "    print(json.dumps({'error': str(e), 'type': type(e).__name__, 'enabled': streamalloc.is_enabled(),\n"
        "                      'cuda_initialized': torch.cuda.is_initialized()}))\n")
    out = json.loads(result.stdout.splitlines()[-1])
    assert out["type"] == "ConfigError"
    assert "unknown option 'bogus_key'" in out["error"]
    assert "unknown option 'bogus_key' in the keyword arguments of streamalloc.enable()" in out["error"]
    assert out["error"].count("streamalloc:") == 1
    assert "known options: backend" in out["error"]  # the accepted keys are listed
    assert not out["enabled"] and not out["cuda_initialized"]


def test_bad_value_names_the_accepted_values():
    result = run_enable(
        "try:\n"
        "    streamalloc.enable('poison:always')\n"
        "except ValueError as e:\n"
        "    print(e)\n")
    assert "bad value 'always' for option 'poison'; accepted: off|free|alloc|both" in result.stdout


def test_bad_item_in_the_environment_is_reported():
    result = run_enable(
        "try:\n"
        "    streamalloc.enable()\n"
        "except ValueError as e:\n"
        "    print(e)\n", env={"STREAMALLOC_CONF": "audit"})
    assert "malformed item 'audit' in STREAMALLOC_CONF" in result.stdout
    assert "e.g. audit:warn" in result.stdout  # a suggestion that enable() accepts


def test_bad_item_in_the_conf_argument_names_the_argument():
    result = run_enable(
        "try:\n"
        "    streamalloc.enable('audit:warn,foo:1')\n"
        "except ValueError as e:\n"
        "    print(e)\n", env={"STREAMALLOC_CONF": "audit:warn"})
    assert "unknown option 'foo' in the conf string passed to streamalloc.enable()" in result.stdout
    assert "STREAMALLOC_CONF" not in result.stdout


def test_simulated_backend_is_refused_under_torch():
    result = run_enable(
        "try:\n"
        "    streamalloc.enable(backend='sim')\n"
        "except ValueError as e:\n"
        "    print(e)\n")
    assert "backend:sim" in result.stdout and "cannot serve PyTorch" in result.stdout


def test_enable_installs_without_initialising_cuda_and_reads_the_environment():
    result = run_enable(
        "streamalloc.enable()\n"
        "print(json.dumps({'enabled': streamalloc.is_enabled(), 'path': streamalloc.active_path(),\n"
        "                  'conf': streamalloc.enabled_conf(), 'cuda_initialized': torch.cuda.is_initialized(),\n"
        "                  'stats': streamalloc.stats(), 'blocks': streamalloc.blocks()}))\n",
        env={"STREAMALLOC_CONF": "audit:warn,quarantine_mb:4"})
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.splitlines()[-1])
    assert out["enabled"] and not out["cuda_initialized"]
    assert out["path"] == ("extension" if HAS_EXTENSION else "c-abi")
    assert "audit:warn" in out["conf"] and "quarantine_mb:4" in out["conf"]
    # The allocator is created by PyTorch's CUDA init; until then it reports an allocator that served
    # nothing, in the shape of one in use.
    assert set(out["stats"]) == {"memory_stats", "stream_stats", "pools"}
    assert out["stats"]["memory_stats"]["allocated_bytes.all.current"] == 0
    assert out["stats"]["stream_stats"]["record_stream_calls"] == 0
    # The default pool alone, empty.
    assert [(pool["id"], pool["segments"]) for pool in out["stats"]["pools"]] == [([0, 0], 0)]
    assert out["blocks"] == []


@pytest.mark.parametrize("path", ["auto", "c-abi"])
def test_readme_example_works_before_cuda_is_used(path):
    # README: print(streamalloc.stats()["stream_stats"]) right after enable(), CUDA not used yet.
    result = run_enable(
        "streamalloc.enable(audit='warn')\n"
        "s = streamalloc.stats()\n"
        "print(json.dumps({'stream_stats': s['stream_stats'], 'memory_stats': s['memory_stats'],\n"
        "                  'cuda_initialized': torch.cuda.is_initialized()}))\n",
        env={"STREAMALLOC_TORCH_PATH": path})
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.splitlines()[-1])
    assert out["stream_stats"]["pending_blocks"]["current"] == 0
    assert out["memory_stats"]["reserved_bytes.all.peak"] == 0
    assert not out["cuda_initialized"]


@pytest.mark.skipif(CUDA_DEVICES > 0, reason="this machine has a CUDA device")
def test_enabling_without_a_cuda_device_says_so_once():
    result = run_enable(
        "streamalloc.enable(audit='warn')\n"
        "streamalloc.enable(audit='warn')\n"
        "print(torch.cuda.is_initialized())\n")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "no CUDA device" in line]
    assert lines == ["streamalloc: enabled, but this process sees no CUDA device, so streamalloc will serve "
                     "no GPU memory (stats() reports zeros)"], result.stderr
    assert result.stdout.split() == ["False"]  # asking for devices did not initialise CUDA


@pytest.mark.parametrize("path, keywords, warned", [
    ("c-abi", "", True),
    ("c-abi", "expandable_segments=True", False),
    pytest.param("extension", "", False, marks=requires_extension),
])
def test_pytorchs_expandable_segments_setting_is_named_where_it_is_not_followed(path, keywords, warned):
    # The extension follows PyTorch's settings (docs/pytorch.md, "PyTorch's allocator settings"); the C
    # ABI path does not, and says so unless streamalloc has its own setting.
    result = run_enable(f"streamalloc.enable({keywords})\nprint(streamalloc.enabled_conf())\n",
                        env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128, expandable_segments:True",
                             "STREAMALLOC_TORCH_PATH": path})
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "PYTORCH_CUDA_ALLOC_CONF" in line]
    assert lines == ([_enable.EXPANDABLE_MESSAGE] if warned else []), result.stderr
    assert ("expandable_segments:true" in result.stdout) == ("expandable" in keywords), result.stdout


@pytest.mark.parametrize("env_value, own, expected", [
    ("1", "", "expandable_ipc:true"),
    ("0", "", "expandable_ipc:false"),
    ("1", "expandable_ipc:false", "expandable_ipc:false"),
    (None, "", "expandable_ipc:false"),
])
def test_pytorchs_expandable_ipc_switch_turns_on_expandable_ipc_unless_streamalloc_sets_it(env_value, own, expected):
    env = {"STREAMALLOC_CONF": own}
    if env_value is not None:
        env["TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC"] = env_value
    result = run_enable("streamalloc.enable()\nprint(streamalloc.enabled_conf())\n", env=env)
    assert result.returncode == 0, result.stderr
    assert expected in result.stdout.strip().splitlines()[-1], result.stdout


def test_keyword_options_override_the_environment_and_conf_ignores_it():
    result = run_enable(
        "streamalloc.enable(audit='trace')\n"
        "print(streamalloc.enabled_conf())\n", env={"STREAMALLOC_CONF": "audit:warn,poison:free"})
    conf = result.stdout.strip().splitlines()[-1]
    assert "audit:trace" in conf and "poison:free" in conf
    result = run_enable(
        "streamalloc.enable('check_sync:1')\n"
        "print(streamalloc.enabled_conf())\n", env={"STREAMALLOC_CONF": "poison:free"})
    conf = result.stdout.strip().splitlines()[-1]
    assert "check_sync:1" in conf and "poison:free" not in conf


def test_enabling_twice_is_a_no_op_when_identical_and_an_error_otherwise():
    result = run_enable(
        "streamalloc.enable(audit='warn')\n"
        "streamalloc.enable('audit:warn')\n"
        "try:\n"
        "    streamalloc.enable(audit='warn', poison='free')\n"
        "except RuntimeError as e:\n"
        "    print(e)\n")
    assert result.returncode == 0, result.stderr
    assert "already configured with other options" in result.stdout
    assert "poison: 'off' in use, 'free' asked" in result.stdout
    assert "audit:" not in result.stdout  # the key that agrees is not listed


def test_the_c_abi_path_refuses_other_options_with_the_same_rule():
    result = run_enable(
        "streamalloc.enable(audit='warn')\n"
        "streamalloc.enable(' audit : warn ')\n"
        "try:\n"
        "    streamalloc.enable(audit='warn', poison='free')\n"
        "except RuntimeError as e:\n"
        "    print(e)\n", env={"STREAMALLOC_TORCH_PATH": "c-abi"})
    assert result.returncode == 0, result.stderr
    assert "already configured with other options (poison: 'off' in use, 'free' asked)" in result.stdout


def test_enable_after_cuda_init_says_how_to_fix_it():
    # Stands in for a real CUDA init (tests/python/test_gpu_torch.py has the real one): enable() must
    # look at PyTorch's state before installing anything.
    result = run_enable(
        "torch.cuda.is_initialized = lambda: True\n"
        "try:\n"
        "    streamalloc.enable()\n"
        "except RuntimeError as e:\n"
        "    print(json.dumps({'error': str(e), 'enabled': streamalloc.is_enabled()}))\n")
    out = json.loads(result.stdout.splitlines()[-1])
    assert "after CUDA was initialised" in out["error"]
    assert "python -m streamalloc script.py" in out["error"]
    assert not out["enabled"]


def test_c_abi_path_can_be_forced():
    result = run_enable(
        "streamalloc.enable()\n"
        "print(streamalloc.active_path(), type(torch._C._cuda_getAllocator()).__name__)\n",
        env={"STREAMALLOC_TORCH_PATH": "c-abi"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["c-abi", "_CUDAPluggableAllocator"]


def test_unknown_path_choice_is_an_error():
    result = run_enable(
        "try:\n"
        "    streamalloc.enable()\n"
        "except ValueError as e:\n"
        "    print(e)\n", env={"STREAMALLOC_TORCH_PATH": "fast"})
    assert "STREAMALLOC_TORCH_PATH='fast' is not one of auto, extension, c-abi" in result.stdout


def test_queries_before_enable_say_what_to_do():
    result = run_enable(
        "try:\n"
        "    streamalloc.stats()\n"
        "except RuntimeError as e:\n"
        "    print(e)\n")
    assert "not enabled" in result.stdout and "python -m streamalloc" in result.stdout


@requires_extension
def test_extension_serves_pytorchs_memory_queries():
    result = run_enable(
        "streamalloc.enable(audit='warn')\n"
        "snapshot = torch.cuda.memory._snapshot()\n"
        "try:\n"
        "    torch._C._cuda_memoryStats(0)\n"
        "    stats_error = None\n"
        "except RuntimeError as e:\n"
        "    stats_error = str(e)\n"
        "print(json.dumps({'segments': snapshot['segments'], 'traces': snapshot['device_traces'],\n"
        "                  'settings': snapshot['allocator_settings']['PYTORCH_CUDA_ALLOC_CONF'],\n"
        "                  'conf': streamalloc.enabled_conf(), 'stats_error': stats_error,\n"
        "                  'cuda_initialized': torch.cuda.is_initialized()}))\n")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.splitlines()[-1])
    # snapshot() is streamalloc's override: empty before CUDA init, with streamalloc's options where
    # PyTorch's allocator puts PYTORCH_CUDA_ALLOC_CONF.
    assert out["segments"] == [] and out["traces"] == []
    assert out["settings"] == out["conf"] and "audit:warn" in out["conf"]
    assert not out["cuda_initialized"]
    if out["stats_error"] is not None:  # no GPU here: the override is reached and says why it cannot serve
        assert out["stats_error"].startswith("streamalloc:")


@pytest.mark.parametrize("check_sync", [False, True])
def test_check_sync_forwards_pytorchs_gpu_trace(check_sync):
    result = run_enable(
        f"streamalloc.enable(check_sync={check_sync})\n"
        "from torch.cuda import _gpu_trace as t\n"
        "registries = [t.EventRecordCallbacks, t.EventWaitCallbacks, t.StreamSynchronizationCallbacks,\n"
        "              t.DeviceSynchronizationCallbacks]\n"
        "# Fired by hand: before CUDA init there is no allocator, and the forwarding must not fail.\n"
        "t.EventRecordCallbacks.fire_callbacks(0x1000, 0x2000)\n"
        "t.EventWaitCallbacks.fire_callbacks(0x1000, 0)\n"
        "t.StreamSynchronizationCallbacks.fire_callbacks(0x2000)\n"
        "t.DeviceSynchronizationCallbacks.fire_callbacks()\n"
        "print(json.dumps([len(r.callback_list) for r in registries]))\n")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == [1 if check_sync else 0] * 4
    assert "Exception in callback" not in result.stderr

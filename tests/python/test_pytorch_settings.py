"""PyTorch's allocator settings under streamalloc (docs/pytorch.md, "PyTorch's allocator settings").

torch.cuda.memory._set_allocator_settings goes through PyTorch's own parsers first, so a setting PyTorch
refuses raises PyTorch's own exception, with or without streamalloc, and streamalloc sees only what
PyTorch accepted. That part runs on any machine with a CUDA build of torch. What the settings then do to
streamalloc's rounding, expandable segments and capture reuse is checked on the simulated device by
tests/torch/test_torch_settings.cpp and tests/api/test_runtime_settings.cpp, and on a GPU by
test_gpu_settings below (skipped without one)."""

import json

import pytest
from support import CUDA_DEVICES, requires_extension, requires_torch, run_code

pytestmark = [requires_extension, requires_torch]

SETTINGS = [
    "roundup_power2_divisions:3",
    "roundup_power2_divisions:[64:8,>:3]",
    "expandable_segments:maybe",
    "graph_capture_record_stream_reuse:maybe",
    "roundup_power2_divisions:[64:8,256:2,>:1]",
    "expandable_segments:True,graph_capture_record_stream_reuse:True",
    "expandable_segments:False,graph_capture_record_stream_reuse:False",
    "",
]

PROBE = """
import json, torch
{enable}
out = []
for settings in {settings!r}:
    try:
        torch.cuda.memory._set_allocator_settings(settings)
        out.append([settings, None, None])
    except Exception as e:
        out.append([settings, type(e).__name__, str(e).splitlines()[0]])
print(json.dumps(out))
"""


def settings_outcomes(enable: str) -> list:
    result = run_code(PROBE.format(enable=enable, settings=SETTINGS))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_settings_are_accepted_and_refused_as_pytorch_does():
    native = settings_outcomes("")
    ours = settings_outcomes("import streamalloc; streamalloc.enable()")
    assert ours == native
    refused = {settings: error for settings, error, _ in native if error is not None}
    assert set(refused) == {SETTINGS[0], SETTINGS[1], SETTINGS[2], SETTINGS[3]}, native
    assert refused[SETTINGS[0]] == "ValueError"


GPU_PROBE = """
import json, torch
{enable}
torch.cuda.init()  # PyTorch's memory_stats() is empty before CUDA is initialised
key = "active_bytes.all.allocated"
stats = lambda: torch.cuda.memory_stats().get(key, 0)
nbytes = 4 * 21 * 1024 * 1024
out = {{}}
torch.cuda.memory._set_allocator_settings("")
start = stats(); x = torch.empty(nbytes // 4, device="cuda"); out["plain"] = stats() - start
torch.cuda.memory._set_allocator_settings("roundup_power2_divisions:4")
start = stats(); y = torch.empty(nbytes // 4, device="cuda"); out["div4"] = stats() - start
torch.cuda.memory._set_allocator_settings("roundup_power2_divisions:[64:8,256:2,>:1]")
start = stats(); z = torch.empty(nbytes // 4, device="cuda"); out["div8"] = stats() - start
torch.cuda.memory._set_allocator_settings("")
del x, y, z
torch.cuda.empty_cache()
torch.cuda.memory._set_allocator_settings("expandable_segments:True")
b = torch.empty(1024 * 1024 // 4, device="cuda")
torch.cuda.memory._set_allocator_settings("expandable_segments:False")
c = torch.empty(30 * 1024 * 1024 // 4, device="cuda")
out["segments"] = sorted(bool(s["is_expandable"]) for s in torch.cuda.memory_snapshot())
del b, c
torch.cuda.empty_cache()

torch.cuda.memory._set_allocator_settings("graph_capture_record_stream_reuse:True")
s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
g = torch.cuda.CUDAGraph(keep_graph=True)
torch.cuda.synchronize()
with torch.cuda.stream(s1):
    g.capture_begin()
    sink = torch.empty(8, device="cuda")
    d1 = torch.empty(8, device="cuda"); p1 = d1.data_ptr()
    s2.wait_stream(s1)
    with torch.cuda.stream(s2):
        buf = torch.empty_like(d1); torch.add(d1, 2.0, out=buf); d1.record_stream(s2)
    del d1
    d2 = torch.empty(8, device="cuda")
    s1.wait_stream(s2)
    sink.fill_(1.0)
    d3 = torch.empty(8, device="cuda")
    g.capture_end()
torch.cuda.synchronize()
out["reuse"] = [d2.data_ptr() == p1, d3.data_ptr() == p1]
torch.cuda.memory._set_allocator_settings("graph_capture_record_stream_reuse:False")
print(json.dumps(out))
"""


@pytest.mark.skipif(CUDA_DEVICES == 0, reason="needs a CUDA device")
def test_gpu_settings():
    outcomes = []
    for enable in ("", "import streamalloc; streamalloc.enable()"):
        result = run_code(GPU_PROBE.format(enable=enable))
        assert result.returncode == 0, result.stderr
        outcomes.append(json.loads(result.stdout.splitlines()[-1]))
    native, ours = outcomes
    mib = 1024 * 1024
    assert native["plain"] == 84 * mib and native["div4"] == 96 * mib and native["div8"] == 88 * mib, native
    assert ours == native
    assert ours["segments"] == [False, True], "expandable while the setting is on, fixed again after"
    assert ours["reuse"] == [False, True], "reused only after the side stream joined"

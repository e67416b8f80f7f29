"""pytest plugin for run_test_cuda.py: chooses the CUDA allocator for the whole pytest process before
anything touches CUDA, and reports which one ran.

STREAMALLOC_UPSTREAM_MODE: "native" (PyTorch's allocator), or "streamalloc" (streamalloc's extension
path, with the options of STREAMALLOC_CONF). STREAMALLOC_UPSTREAM_REPORT: a JSON file to write at the
end of the session (mode, allocator backend, streamalloc's path and options, selected tests the file
does not have). STREAMALLOC_UPSTREAM_TESTS: a file of "Class::test" lines (run_test_cuda.py's format):
only those run, in the test file's order. STREAMALLOC_UPSTREAM_PROGRESS: a JSON-lines file that gets each
test's outcome as it finishes (so a run stopped at its time limit still says what ran), and for a
failure the locals of the failing test's frame in full (assertion messages show them truncated).
"""

from __future__ import annotations

import json
import os


def _define_missing_test_flags() -> None:
    # A test_cuda.py newer than the installed torch imports TEST_CUDAMALLOCASYNC from common_utils,
    # which torch 2.11's copy does not define: it says whether PyTorch's cudaMallocAsync backend is
    # configured, which the allocator configuration alone decides.
    try:
        import torch.testing._internal.common_utils as common_utils
    except ImportError:
        return  # no torch test utilities here: a test file that needs them says so when it is imported

    if not hasattr(common_utils, "TEST_CUDAMALLOCASYNC"):
        conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + "," + os.environ.get("PYTORCH_ALLOC_CONF", "")
        common_utils.TEST_CUDAMALLOCASYNC = "backend:cudaMallocAsync" in conf.replace(" ", "")


def pytest_configure(config):
    mode = os.environ.get("STREAMALLOC_UPSTREAM_MODE", "native")
    if mode not in ("native", "streamalloc"):
        raise ValueError(f"STREAMALLOC_UPSTREAM_MODE={mode!r}: expected native or streamalloc")
    if mode == "streamalloc":
        os.environ.setdefault("STREAMALLOC_TORCH_PATH", "extension")
        import streamalloc

        streamalloc.enable()  # STREAMALLOC_CONF; before the test module's import initialises CUDA
        if streamalloc.active_path() != "extension":
            raise RuntimeError(f"streamalloc runs on the {streamalloc.active_path()} path, not the extension")
    _define_missing_test_flags()


_missing: list[str] = []


def _wanted() -> list[str] | None:
    path = os.environ.get("STREAMALLOC_UPSTREAM_TESTS")
    if not path:
        return None
    with open(path) as f:
        return [line.split("#", 1)[0].strip() for line in f if line.split("#", 1)[0].strip()]


def pytest_collection_modifyitems(session, config, items):
    wanted = _wanted()
    if wanted is None:
        return
    keep, found = [], set()
    for item in items:
        cls = item.cls.__name__ if item.cls is not None else ""
        name = f"{cls}::{item.name}"
        if name in wanted:
            keep.append(item)
            found.add(name)
    deselected = [item for item in items if item not in keep]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
    items[:] = keep
    _missing[:] = [name for name in wanted if name not in found]


def _failing_test_locals(excinfo, test_file: str) -> dict:
    """The locals of the innermost frame of the failing test's own file, each as its repr."""
    tb = excinfo.tb if excinfo is not None else None
    found = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == test_file:
            found = tb.tb_frame
        tb = tb.tb_next
    if found is None:
        return {}
    out = {}
    for name, value in found.f_locals.items():
        if name == "self":
            continue
        try:
            out[name] = repr(value)[:500000]
        except Exception as error:  # noqa: BLE001  (a repr that fails says so)
            out[name] = f"<repr failed: {error!r}>"
    return out


import pytest  # noqa: E402


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    path = os.environ.get("STREAMALLOC_UPSTREAM_PROGRESS")
    if not path or not (report.when == "call" or report.outcome != "passed"):
        return
    cls = item.cls.__name__ if item.cls is not None else ""
    status = report.outcome
    if report.when != "call" and status == "failed":
        status = "error"
    if hasattr(report, "wasxfail"):
        status = "xfail" if report.skipped else "xpass"
    entry = {"test": f"{cls}::{item.name}", "when": report.when, "outcome": status,
             "seconds": round(report.duration, 3)}
    if report.failed:
        entry["message"] = str(report.longrepr)[-4000:]
        entry["locals"] = _failing_test_locals(call.excinfo, str(item.fspath))
    with open(path, "a") as f:
        f.write(json.dumps(entry) + "\n")


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("STREAMALLOC_UPSTREAM_REPORT")
    if not path:
        return
    report = {"mode": os.environ.get("STREAMALLOC_UPSTREAM_MODE", "native"), "exitstatus": int(exitstatus),
              "selected_but_not_in_file": list(_missing)}
    try:
        import torch

        report["torch"] = torch.__version__
        report["allocator_backend"] = torch.cuda.get_allocator_backend() if torch.cuda.is_available() else None
    except Exception as error:  # noqa: BLE001  (reported, not raised, at the end of a run)
        report["torch_error"] = repr(error)
    try:
        import streamalloc

        report["streamalloc_path"] = streamalloc.active_path()
        report["streamalloc_conf"] = streamalloc.enabled_conf()
    except Exception as error:  # noqa: BLE001
        report["streamalloc_error"] = repr(error)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)

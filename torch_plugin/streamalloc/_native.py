"""Finding and loading streamalloc's native code.

Two native pieces can serve PyTorch:
- the LibTorch extension `_torch_ext` (a CUDAPluggableAllocator subclass that also serves
  torch.cuda.memory_stats(), snapshots, cacheInfo and OutOfMemoryError), and
- the C ABI library libstreamalloc.so, which PyTorch's own Python CUDAPluggableAllocator can load.

Both are looked up in the directories of STREAMALLOC_LIBRARY_DIR (a os.pathsep-separated list, for
build trees and tests) and then next to this package (an installed wheel). Loading the C library
never imports torch; loading the extension imports torch first, because the extension links against
the libtorch libraries that `import torch` loads.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import json
import os
from pathlib import Path
from types import ModuleType

LIBRARY_DIR_VARIABLE = "STREAMALLOC_LIBRARY_DIR"
C_LIBRARY_NAME = "libstreamalloc.so"
EXTENSION_NAME = "_torch_ext"

# streamalloc_last_error_code() values (streamalloc.h).
_ERROR_CODES = {1: "out of memory", 2: "invalid argument", 3: "configuration error", 4: "device error",
                5: "shut down"}


class StreamallocError(RuntimeError):
    """A call into the native library failed; the message is the library's own report."""

    def __init__(self, message: str, code: int = 0):
        super().__init__(message)
        self.code = code


class ConfigError(ValueError):
    """An unknown option key or a bad value. The message names the key and the accepted values."""


def search_dirs(environ: dict[str, str] | None = None) -> list[Path]:
    env = (os.environ if environ is None else environ).get(LIBRARY_DIR_VARIABLE, "")
    dirs = [Path(entry) for entry in env.split(os.pathsep) if entry]
    dirs.append(Path(__file__).resolve().parent)
    return dirs


def find_c_library() -> Path | None:
    for directory in search_dirs():
        candidate = directory / C_LIBRARY_NAME
        if candidate.is_file():
            return candidate
    return None


def find_extension() -> Path | None:
    for directory in search_dirs():
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            candidate = directory / (EXTENSION_NAME + suffix)
            if candidate.is_file():
                return candidate
    return None


def not_found_message(what: str) -> str:
    dirs = ", ".join(str(d) for d in search_dirs())
    return (f"streamalloc: {what} was not found (searched: {dirs}). Install the package with "
            f"`pip install --no-build-isolation ./torch_plugin`, or build the repository with CMake and "
            f"set {LIBRARY_DIR_VARIABLE} to the build's torch_plugin (and allocator) directories.")


def load_extension(path: Path) -> ModuleType:
    """Import the extension at `path` as streamalloc._torch_ext."""
    import torch  # noqa: F401  (loads libtorch, libc10 and libc10_cuda, which the extension needs)

    spec = importlib.util.spec_from_file_location(f"streamalloc.{EXTENSION_NAME}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"streamalloc: {path} is not a loadable extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class CLibrary:
    """ctypes binding of streamalloc.h. Methods raise instead of returning error codes."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lib = ctypes.CDLL(str(self.path))
        c_stream = ctypes.c_void_p
        self._declare("streamalloc_malloc", ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_int, c_stream])
        self._declare("streamalloc_free", None, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, c_stream])
        self._declare("streamalloc_record_stream", None, [ctypes.c_void_p, c_stream])
        self._declare("streamalloc_empty_cache", None, [])
        self._declare("streamalloc_configure", ctypes.c_int, [ctypes.c_char_p])
        self._declare("streamalloc_backend_is_cuda", ctypes.c_int, [])
        # The JSON functions return malloc'ed strings that must go back through free_string, so they
        # are declared as void* (ctypes would otherwise copy and leak them).
        self._declare("streamalloc_stats_json", ctypes.c_void_p, [ctypes.c_int])
        self._declare("streamalloc_snapshot_json", ctypes.c_void_p, [])
        self._declare("streamalloc_pending_history_json", ctypes.c_void_p, [ctypes.c_int])
        self._declare("streamalloc_options_json", ctypes.c_void_p, [])
        self._declare("streamalloc_free_string", None, [ctypes.c_void_p])
        self._declare("streamalloc_reset_peak_stats", None, [ctypes.c_int])
        self._declare("streamalloc_validate", ctypes.c_int, [])
        self._declare("streamalloc_note_event_record", None, [ctypes.c_void_p, c_stream])
        self._declare("streamalloc_note_event_wait", None, [ctypes.c_void_p, c_stream])
        self._declare("streamalloc_note_stream_synchronize", None, [c_stream])
        self._declare("streamalloc_note_device_synchronize", None, [])
        self._declare("streamalloc_last_error", ctypes.c_char_p, [])
        self._declare("streamalloc_last_error_code", ctypes.c_int, [])

    def _declare(self, name: str, restype, argtypes) -> None:
        fn = getattr(self._lib, name)
        fn.restype = restype
        fn.argtypes = argtypes

    def address(self, name: str) -> int:
        """The address of an exported function, for torch's set_*_fn hooks."""
        value = ctypes.cast(getattr(self._lib, name), ctypes.c_void_p).value
        if not value:
            raise StreamallocError(f"streamalloc: {self.path} does not export {name}")
        return value

    def _check(self) -> None:
        code = self._lib.streamalloc_last_error_code()
        if code != 0:
            message = (self._lib.streamalloc_last_error() or b"").decode("utf-8", "replace")
            if code == 3:
                raise ConfigError(message)
            raise StreamallocError(message or f"streamalloc: {_ERROR_CODES.get(code, 'error')}", code)

    def _take_string(self, raw: int | None) -> str:
        if not raw:
            self._check()
            raise StreamallocError("streamalloc: the library returned no data")
        try:
            return ctypes.string_at(raw).decode("utf-8")
        finally:
            self._lib.streamalloc_free_string(raw)

    def configure(self, conf: str) -> None:
        if self._lib.streamalloc_configure(conf.encode("utf-8")) != 0:
            self._check()

    def is_initialized(self) -> bool:
        """True once the process-wide allocator exists (PyTorch's lazy CUDA init creates it)."""
        return self._lib.streamalloc_backend_is_cuda() >= 0

    def backend_is_cuda(self) -> bool:
        return self._lib.streamalloc_backend_is_cuda() == 1

    def stats_json(self, device: int) -> str:
        return self._take_string(self._lib.streamalloc_stats_json(device))

    def snapshot_json(self) -> str:
        return self._take_string(self._lib.streamalloc_snapshot_json())

    def pending_history_json(self, device: int) -> str:
        return self._take_string(self._lib.streamalloc_pending_history_json(device))

    def options(self) -> dict:
        return json.loads(self._take_string(self._lib.streamalloc_options_json()))

    def reset_peak_stats(self, device: int) -> None:
        self._lib.streamalloc_reset_peak_stats(device)
        self._check()

    def empty_cache(self) -> None:
        self._lib.streamalloc_empty_cache()
        self._check()

    def validate(self) -> None:
        if self._lib.streamalloc_validate() != 0:
            self._check()

    # check_sync: synchronization streamalloc did not make itself (no-ops unless check_sync:1).
    def note_event_record(self, event: int, stream: int) -> None:
        self._lib.streamalloc_note_event_record(event, stream)

    def note_event_wait(self, event: int, stream: int) -> None:
        self._lib.streamalloc_note_event_wait(event, stream)

    def note_stream_synchronize(self, stream: int) -> None:
        self._lib.streamalloc_note_stream_synchronize(stream)

    def note_device_synchronize(self) -> None:
        self._lib.streamalloc_note_device_synchronize()

    # Direct use of the allocator (tests and tools on the simulated device; PyTorch calls these
    # through the addresses it was given).
    def malloc(self, size: int, device: int = 0, stream: int = 0) -> int:
        ptr = self._lib.streamalloc_malloc(size, device, stream)
        if not ptr:
            self._check()
        return ptr or 0

    def free(self, ptr: int, size: int = 0, device: int = -1, stream: int = 0) -> None:
        self._lib.streamalloc_free(ptr, size, device, stream)
        self._check()

    def record_stream(self, ptr: int, stream: int) -> None:
        self._lib.streamalloc_record_stream(ptr, stream)
        self._check()

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
from typing import NamedTuple

LIBRARY_DIR_VARIABLE = "STREAMALLOC_LIBRARY_DIR"
C_LIBRARY_NAME = "libstreamalloc.so"
EXTENSION_NAME = "_torch_ext"


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


class Function(NamedTuple):
    """One function of streamalloc.h as Python binds it.

    name: the C name without "streamalloc_" (the Python method's name); restype, argtypes: ctypes.
    errors: how a failure shows. "status": an int result, nonzero on failure; "string": a malloc'ed
    char*, NULL on failure, returned as str and released; "pointer": NULL on failure (but also for
    size 0); "always": any call may set the last error; "none": not checked (the check_sync notes,
    which are no-ops unless check_sync:1).
    shared: the extension module _torch_ext has the same function under the same name, so both
    install paths forward it to their native object unchanged.
    """

    name: str
    restype: object
    argtypes: tuple
    errors: str
    shared: bool = False


_stream = ctypes.c_void_p
# The C ABI as Python sees it: CLibrary's methods and both install paths' pass-throughs come from
# this one table. (The functions PyTorch calls through their addresses, such as init and
# set_memory_fraction, are passed to it by CLibrary.address() and need no entry here.)
ABI: tuple[Function, ...] = (
    Function("malloc", ctypes.c_void_p, (ctypes.c_size_t, ctypes.c_int, _stream), "pointer"),
    Function("free", None, (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, _stream), "always"),
    Function("record_stream", None, (ctypes.c_void_p, _stream), "always"),
    Function("empty_cache", None, (), "always"),
    Function("configure", ctypes.c_int, (ctypes.c_char_p,), "status"),
    Function("resolve_conf", ctypes.c_void_p, (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p), "string",
             shared=True),
    Function("backend_is_cuda", ctypes.c_int, (), "none"),
    Function("stats_json", ctypes.c_void_p, (ctypes.c_int,), "string", shared=True),
    Function("zero_stats_json", ctypes.c_void_p, (), "string", shared=True),
    Function("snapshot_json", ctypes.c_void_p, (), "string", shared=True),
    Function("pending_history_json", ctypes.c_void_p, (ctypes.c_int,), "string", shared=True),
    Function("options_json", ctypes.c_void_p, (), "string"),
    Function("reset_peak_stats", None, (ctypes.c_int,), "always", shared=True),
    Function("validate", ctypes.c_int, (), "status", shared=True),
    Function("note_event_record", None, (ctypes.c_void_p, _stream), "none", shared=True),
    Function("note_event_wait", None, (ctypes.c_void_p, _stream), "none", shared=True),
    Function("note_stream_synchronize", None, (_stream,), "none", shared=True),
    Function("note_device_synchronize", None, (), "none", shared=True),
)
SHARED = frozenset(f.name for f in ABI if f.shared)

# Declared for CLibrary's own use: strings are released with free_string, errors read back with these.
_PLUMBING = (
    Function("free_string", None, (ctypes.c_void_p,), "none"),
    Function("last_error", ctypes.c_char_p, (), "none"),
    Function("last_error_code", ctypes.c_int, (), "none"),
    Function("error_name", ctypes.c_char_p, (ctypes.c_int,), "none"),
)


class CLibrary:
    """ctypes binding of streamalloc.h, one method per ABI entry (named without "streamalloc_").
    Methods raise instead of returning error codes: ConfigError for the library's "config" errors,
    StreamallocError (with .code, the header's number) for the others."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lib = ctypes.CDLL(str(self.path))
        for function in ABI + _PLUMBING:
            fn = getattr(self._lib, "streamalloc_" + function.name)
            fn.restype = function.restype
            fn.argtypes = list(function.argtypes)
        for function in ABI:
            setattr(self, function.name, self._bind(function))

    def _bind(self, function: Function):
        fn = getattr(self._lib, "streamalloc_" + function.name)

        def call(*args):
            args = tuple(a.encode("utf-8") if isinstance(a, str) else a for a in args)
            result = fn(*args)
            if function.errors == "string":
                return self._take_string(result)
            if function.errors == "status":
                if result != 0:
                    self._check()
                return None
            if function.errors == "pointer":
                if not result:
                    self._check()
                return result or 0
            if function.errors == "always":
                self._check()
            return result

        call.__name__ = function.name
        call.__doc__ = f"streamalloc_{function.name}() of streamalloc.h"
        return call

    def address(self, name: str) -> int:
        """The address of an exported function, for torch's set_*_fn hooks."""
        value = ctypes.cast(getattr(self._lib, name), ctypes.c_void_p).value
        if not value:
            raise StreamallocError(f"streamalloc: {self.path} does not export {name}")
        return value

    def error_name(self, code: int) -> str | None:
        """The library's name of an error code ("config", "out_of_memory", ...); None for no code."""
        name = self._lib.streamalloc_error_name(code)
        return name.decode("ascii") if name else None

    def _check(self) -> None:
        code = self._lib.streamalloc_last_error_code()
        if code != 0:
            message = (self._lib.streamalloc_last_error() or b"").decode("utf-8", "replace")
            name = self.error_name(code)
            if name == "config":
                raise ConfigError(message)
            raise StreamallocError(message or f"streamalloc: {name or 'error'} (code {code})", code)

    def _take_string(self, raw: int | None) -> str:
        if not raw:
            self._check()
            raise StreamallocError("streamalloc: the library returned no data")
        try:
            return ctypes.string_at(raw).decode("utf-8")
        finally:
            self._lib.streamalloc_free_string(raw)

    def is_initialized(self) -> bool:
        """True once the process-wide allocator exists (PyTorch's lazy CUDA init creates it)."""
        return self.backend_is_cuda() >= 0

    def options(self) -> dict:
        return json.loads(self.options_json())

"""enable(): make streamalloc PyTorch's CUDA allocator, through the extension or the C ABI.

PyTorch picks its CUDA allocator once per process: torch._C._cuda_changeCurrentAllocator refuses to
swap an allocator that CUDA initialisation has already set up. So enable() must run before the first
CUDA operation, and it never does CUDA work itself (the allocator is created by PyTorch's lazy CUDA
init, through the init hook), so that the launcher can enable it and still leave the script free to
fork, set CUDA_VISIBLE_DEVICES and so on.

Two paths:
- "extension": streamalloc._torch_ext, a LibTorch CUDAPluggableAllocator subclass that serves
  torch.cuda.memory_stats(), memory_allocated(), _snapshot(), cacheInfo (cudnn.benchmark),
  get_per_process_memory_fraction(), the private pools of CUDA graphs, MemPool and
  torch.compile(mode="reduce-overhead"), and raises torch.cuda.OutOfMemoryError.
- "c-abi": PyTorch's Python CUDAPluggableAllocator over libstreamalloc.so, with record_stream,
  empty_cache, memory fraction, init and base_alloc hooks set from ctypes function addresses. What
  PyTorch 2.11's pluggable base class does not support stays unsupported there (docs/pytorch.md),
  memory pools included: a graph captured on this path has no private pool.
STREAMALLOC_TORCH_PATH=auto|extension|c-abi chooses (auto: the extension when it is found).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import warnings
from typing import Protocol

from . import _conf, _native, _sync_trace

PATH_VARIABLE = "STREAMALLOC_TORCH_PATH"
_PATH_CHOICES = ("auto", "extension", "c-abi")

TOO_LATE_MESSAGE = (
    "streamalloc.enable() was called after CUDA was initialised in this process (a CUDA tensor, a "
    "CUDA call or torch.cuda.init() came first), and PyTorch cannot swap its CUDA allocator once it is "
    "in use. Call streamalloc.enable() before the first CUDA operation (right after `import torch`), "
    "or run the program under the launcher, which enables it before your code starts: "
    "`python -m streamalloc script.py [args]` or `python -m streamalloc -m module [args]`."
)


class InstallPath(Protocol):
    """What enable() needs of a path. Every function _native.ABI marks `shared` (stats_json,
    snapshot_json, note_event_record, ...) is also forwarded unchanged to the path's native object."""

    name: str

    def resolve(self, base: str, conf: str, source: str) -> dict: ...
    def install(self, conf: str) -> None: ...
    def install_again(self, conf: str) -> None: ...
    def is_initialized(self) -> bool: ...


class _NativePath:
    """What both paths share: the functions of _native.ABI marked `shared` go straight to the native
    object (the extension module or the C library), which exposes them under the same names; and the
    options are resolved by the native parser."""

    def __init__(self, native):
        self._native = native

    def __getattr__(self, name: str):
        if name in _native.SHARED:
            return getattr(self.__dict__["_native"], name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def is_initialized(self) -> bool:
        return self._native.is_initialized()

    def resolve(self, base: str, conf: str, source: str) -> dict:
        """{"conf": canonical conf string, "options": {key: value}} of `conf` on top of `base`, from
        the native parser, whose messages name the key, the accepted values and `source`."""
        try:
            text = self._native.resolve_conf(base, conf, source)
        except ValueError as error:  # ConfigError from the C library, ValueError from the extension
            raise _native.ConfigError(str(error)) from None
        return json.loads(text)


class ExtensionPath(_NativePath):
    """The LibTorch extension (streamalloc::torch::install)."""

    name = "extension"

    def install(self, conf: str) -> None:
        self._native.install(conf)

    def install_again(self, conf: str) -> None:
        # install() again: nothing with the same options, RuntimeError naming the keys that differ.
        self._native.install(conf)


class CAbiPath(_NativePath):
    """libstreamalloc.so through torch.cuda.memory.CUDAPluggableAllocator and ctypes."""

    name = "c-abi"

    def __init__(self, library: _native.CLibrary):
        super().__init__(library)
        self._lib = library
        self._torch_allocator = None  # keeps the Python wrapper alive with the process

    def install(self, conf: str) -> None:
        import torch

        # Fixes the options of the process-wide allocator; it stays unused (and no CUDA work happens)
        # until PyTorch's CUDA init calls the init hook.
        self._lib.configure(conf)
        allocator = torch.cuda.memory.CUDAPluggableAllocator(
            str(self._lib.path), "streamalloc_malloc", "streamalloc_free")
        hooks = allocator.allocator()  # torch._C._CUDAPluggableAllocator
        hooks.set_init_fn(self._lib.address("streamalloc_init"))
        hooks.set_record_stream_fn(self._lib.address("streamalloc_record_stream"))
        hooks.set_reset_fn(self._lib.address("streamalloc_empty_cache"))
        hooks.set_memory_fraction_fn(self._lib.address("streamalloc_set_memory_fraction"))
        hooks.set_base_alloc_fn(self._lib.address("streamalloc_base_alloc"))
        torch.cuda.memory.change_current_allocator(allocator)
        self._torch_allocator = allocator

    def install_again(self, conf: str) -> None:
        # configure() again: nothing with the same options, an error naming the keys that differ. The
        # options parsed already, so that error is about the state, as on the extension path.
        try:
            self._lib.configure(conf)
        except _native.ConfigError as error:
            raise RuntimeError(str(error)) from None


class _State:
    def __init__(self):
        self.lock = threading.Lock()
        self.path: InstallPath | None = None  # the path chosen (loaded once per process)
        self.enabled_conf: str | None = None  # canonical options once enabled


_state = _State()


def _choose_path() -> InstallPath:
    if _state.path is not None:
        return _state.path
    choice = os.environ.get(PATH_VARIABLE, "auto").strip() or "auto"
    if choice not in _PATH_CHOICES:
        raise ValueError(f"streamalloc: {PATH_VARIABLE}={choice!r} is not one of {', '.join(_PATH_CHOICES)}")
    if choice in ("auto", "extension"):
        extension = _native.find_extension()
        if extension is not None:
            try:
                _state.path = ExtensionPath(_native.load_extension(extension))
                return _state.path
            except ImportError as error:
                if choice == "extension":
                    raise
                warnings.warn(f"streamalloc: the extension {extension} did not load ({error}); "
                              "falling back to the C ABI, where torch.cuda.memory_stats() and "
                              "OutOfMemoryError are not available", RuntimeWarning, stacklevel=3)
        elif choice == "extension":
            raise RuntimeError(_native.not_found_message(f"the extension {_native.EXTENSION_NAME}"))
    library = _native.find_c_library()
    if library is None:
        raise RuntimeError(_native.not_found_message(_native.C_LIBRARY_NAME))
    try:
        _state.path = CAbiPath(_native.CLibrary(library))
    except OSError as error:  # e.g. the CUDA runtime it links against is missing
        raise RuntimeError(f"streamalloc: {library} did not load: {error}") from error
    return _state.path


def _import_torch_with_cuda():
    # Under STREAMALLOC_ENABLE=1 the switch's hook (streamalloc/_autoenable.py, loaded by the .pth) watches
    # this import; the marker tells it that this call installs the allocator, with its own options.
    hook = sys.modules.get("streamalloc._autoenable")
    try:
        if hook is None:
            import torch
        else:
            with hook.explicit_torch_import():
                import torch
    except ImportError as error:
        raise RuntimeError("streamalloc.enable() needs PyTorch: `import torch` failed "
                           f"({error})") from error
    if torch.version.cuda is None:
        raise RuntimeError(f"streamalloc.enable() needs a CUDA build of PyTorch; this one ({torch.__version__}) "
                           "has no CUDA support")
    return torch


ENABLE_CONF_SOURCE = "the conf string passed to streamalloc.enable()"
KEYWORD_SOURCE = "the keyword arguments of streamalloc.enable()"
NO_DEVICE_MESSAGE = (
    "streamalloc: enabled, but this process sees no CUDA device, so streamalloc will serve no GPU "
    "memory (stats() reports zeros)"
)
EXPANDABLE_MESSAGE = (
    "streamalloc: PYTORCH_CUDA_ALLOC_CONF sets expandable_segments:True, which configures PyTorch's own "
    "allocator; streamalloc's C ABI path follows none of PyTorch's settings and serves this process with "
    "fixed segments. For streamalloc's expandable segments set expandable_segments:true in STREAMALLOC_CONF "
    "or call streamalloc.enable(expandable_segments=True) (docs/options.md)"
)
_log = logging.getLogger("streamalloc")


def _pytorch_asks_for_expandable_segments() -> bool:
    """Whether PYTORCH_CUDA_ALLOC_CONF turns on PyTorch's expandable segments (its "key:value,..." syntax)."""
    items = (item.split(":", 1) for item in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").split(",") if ":" in item)
    return any(key.strip() == "expandable_segments" and value.strip().lower() in ("true", "1") for key, value in items)


def _pytorch_asks_for_expandable_ipc() -> bool:
    """Whether TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC asks PyTorch to make expandable segments shareable."""
    return os.environ.get("TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC", "").strip().lower() in ("1", "true")


def enable(conf: str | None = None, **options: object) -> None:
    """Install streamalloc as PyTorch's CUDA allocator for this process.

    conf: a "key:value,..." string; when None, STREAMALLOC_CONF is read. Keyword options use the same
    keys and override items of `conf` (e.g. enable(audit="warn", poison="free")).

    Raises ValueError (ConfigError) for an unknown key or a bad value, before any CUDA work;
    RuntimeError when CUDA is already initialised, when streamalloc was enabled before with other
    options, or when the native library is missing. Enabling again with identical options is a no-op.
    """
    if conf is None:
        enable_from(_conf.conf_from_env(), _conf.CONF_VARIABLE, options)
    else:
        enable_from(conf, ENABLE_CONF_SOURCE, options)


def enable_from(conf: str, source: str, options: dict | None = None) -> None:
    """enable() with the options of `conf`, whose errors name `source` (where the string came from:
    "STREAMALLOC_CONF", "--conf", ...), and `options` on top."""
    if not isinstance(conf, str):
        raise TypeError(f"streamalloc.enable(): conf must be a str, got {type(conf).__name__}")
    keywords = _conf.options_conf(options or {})
    # torch first: it loads the CUDA runtime and libtorch that both native paths link against (a pip
    # torch carries its own libcudart). Importing it does no CUDA work.
    torch = _import_torch_with_cuda()
    with _state.lock:
        path = _choose_path()
        resolved = path.resolve("", conf, source)
        if keywords:
            resolved = path.resolve(resolved["conf"], keywords, KEYWORD_SOURCE)
        # PyTorch's switch for shareable expandable segments turns on streamalloc's, unless streamalloc's
        # own options say otherwise (docs/options.md, expandable_ipc).
        own_keys = _conf.conf_keys(conf) | _conf.conf_keys(keywords)
        if "expandable_ipc" not in own_keys and _pytorch_asks_for_expandable_ipc():
            resolved = path.resolve(resolved["conf"], "expandable_ipc:true", "TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC")
        canonical, settings = resolved["conf"], resolved["options"]
        if _state.enabled_conf is not None:
            path.install_again(canonical)  # the native rule: same options or refuse
            return
        if settings.get("backend") == "sim":
            raise _native.ConfigError(
                "streamalloc: backend:sim simulates a device in host memory and cannot serve PyTorch's CUDA "
                "tensors; use backend:cuda or backend:auto with PyTorch")
        if torch.cuda.is_initialized():
            raise RuntimeError(TOO_LATE_MESSAGE)
        path.install(canonical)
        _state.enabled_conf = canonical
        if settings.get("check_sync") == "1":
            _sync_trace.forward_to(path)
    # Said once, at the first enable: on the C ABI path a program moved from PyTorch's allocator would
    # otherwise lose the setting without a word (the extension follows PyTorch's settings).
    if (path.name == "c-abi" and settings.get("expandable_segments") != "true"
            and _pytorch_asks_for_expandable_segments()):
        _log.warning(EXPANDABLE_MESSAGE)
    # Said once, at the first enable. device_count() asks NVML first, which initialises no CUDA context
    # (the program may still fork); PyTorch's lazy CUDA init stays untouched either way.
    if torch.cuda.device_count() == 0:
        _log.warning(NO_DEVICE_MESSAGE)


def is_enabled() -> bool:
    """True once enable() has installed streamalloc in this process."""
    return _state.enabled_conf is not None


def active_path() -> str | None:
    """"extension" or "c-abi": how streamalloc serves PyTorch in this process; None before enable()."""
    return _state.path.name if is_enabled() and _state.path is not None else None


def enabled_conf() -> str | None:
    """The options streamalloc was enabled with, as a conf string; None before enable()."""
    return _state.enabled_conf


def enabled_path() -> InstallPath:
    """The installed path; RuntimeError saying what to do when streamalloc is not enabled."""
    if not is_enabled() or _state.path is None:
        raise RuntimeError("streamalloc is not enabled in this process: call streamalloc.enable() before the "
                           "first CUDA operation, or run under `python -m streamalloc script.py`")
    return _state.path

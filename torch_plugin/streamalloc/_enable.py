"""enable(): make streamalloc PyTorch's CUDA allocator, through the extension or the C ABI.

PyTorch picks its CUDA allocator once per process: torch._C._cuda_changeCurrentAllocator refuses to
swap an allocator that CUDA initialisation has already set up. So enable() must run before the first
CUDA operation, and it never does CUDA work itself (the allocator is created by PyTorch's lazy CUDA
init, through the init hook), so that the launcher can enable it and still leave the script free to
fork, set CUDA_VISIBLE_DEVICES and so on.

Two paths:
- "extension": streamalloc._torch_ext, a LibTorch CUDAPluggableAllocator subclass that serves
  torch.cuda.memory_stats(), memory_allocated(), _snapshot(), cacheInfo (cudnn.benchmark),
  get_per_process_memory_fraction() and raises torch.cuda.OutOfMemoryError.
- "c-abi": PyTorch's Python CUDAPluggableAllocator over libstreamalloc.so, with record_stream,
  empty_cache, memory fraction, init and base_alloc hooks set from ctypes function addresses. What
  PyTorch 2.11's pluggable base class does not support stays unsupported there (docs/pytorch.md).
STREAMALLOC_TORCH_PATH=auto|extension|c-abi chooses (auto: the extension when it is found).
"""

from __future__ import annotations

import os
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
    name: str

    def canonical(self, conf: str) -> str: ...
    def validate(self, conf: str) -> None: ...
    def install(self, conf: str) -> None: ...
    def is_initialized(self) -> bool: ...
    def stats_json(self, device: int) -> str: ...
    def snapshot_json(self) -> str: ...
    def pending_history_json(self, device: int) -> str: ...
    def reset_peak_stats(self, device: int) -> None: ...
    def note_event_record(self, event: int, stream: int) -> None: ...
    def note_event_wait(self, event: int, stream: int) -> None: ...
    def note_stream_synchronize(self, stream: int) -> None: ...
    def note_device_synchronize(self) -> None: ...


class _Reports:
    """The calls both paths pass straight to their native object (the extension module or the C
    library), which expose them under the same names."""

    def __init__(self, native):
        self._native = native

    def is_initialized(self) -> bool:
        return self._native.is_initialized()

    def stats_json(self, device: int) -> str:
        return self._native.stats_json(device)

    def snapshot_json(self) -> str:
        return self._native.snapshot_json()

    def pending_history_json(self, device: int) -> str:
        return self._native.pending_history_json(device)

    def reset_peak_stats(self, device: int) -> None:
        self._native.reset_peak_stats(device)

    def note_event_record(self, event: int, stream: int) -> None:
        self._native.note_event_record(event, stream)

    def note_event_wait(self, event: int, stream: int) -> None:
        self._native.note_event_wait(event, stream)

    def note_stream_synchronize(self, stream: int) -> None:
        self._native.note_stream_synchronize(stream)

    def note_device_synchronize(self) -> None:
        self._native.note_device_synchronize()


class ExtensionPath(_Reports):
    """The LibTorch extension; options are parsed and compared by the native Options table."""

    name = "extension"

    def __init__(self, module):
        super().__init__(module)
        self._ext = module

    def canonical(self, conf: str) -> str:
        try:
            return self._ext.resolve_conf(conf)
        except ValueError as error:  # the native message names the key and the accepted values
            raise _native.ConfigError(str(error)) from None

    def validate(self, conf: str) -> None:
        self.canonical(conf)

    def install(self, conf: str) -> None:
        self._ext.install(conf)


class CAbiPath(_Reports):
    """libstreamalloc.so through torch.cuda.memory.CUDAPluggableAllocator and ctypes."""

    name = "c-abi"

    def __init__(self, library: _native.CLibrary):
        super().__init__(library)
        self._lib = library
        self._torch_allocator = None  # keeps the Python wrapper alive with the process

    def canonical(self, conf: str) -> str:
        # The C ABI has no parse-only call, so "identical" is judged on the items as written.
        return ",".join(f"{k}:{v}" for k, v in sorted(_conf.conf_to_dict(conf).items()))

    def validate(self, conf: str) -> None:
        # Configuring the process-wide allocator parses the options; it stays unused (and no CUDA
        # work happens) until PyTorch's CUDA init calls the init hook.
        self._lib.configure(conf)

    def install(self, conf: str) -> None:
        import torch

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
    try:
        import torch
    except ImportError as error:
        raise RuntimeError("streamalloc.enable() needs PyTorch: `import torch` failed "
                           f"({error})") from error
    if torch.version.cuda is None:
        raise RuntimeError(f"streamalloc.enable() needs a CUDA build of PyTorch; this one ({torch.__version__}) "
                           "has no CUDA support")
    return torch


def _name_the_source(message: str, options: dict, conf_given: bool) -> str:
    """The native parser says "in STREAMALLOC_CONF"; say where the bad item really came from."""
    where = " in STREAMALLOC_CONF"
    if any(f"'{key}'" in message for key in options):
        return message.replace(where, " (a keyword argument of streamalloc.enable())")
    if conf_given:
        return message.replace(where, " in the conf string passed to streamalloc.enable()")
    return message


def _describe_difference(enabled: str, asked: str) -> str:
    before, after = _conf.conf_to_dict(enabled), _conf.conf_to_dict(asked)
    changes = [f"{key}: enabled with {before.get(key, '(default)')!r}, now asked for {after.get(key, '(default)')!r}"
               for key in sorted(before.keys() | after.keys()) if before.get(key) != after.get(key)]
    return "; ".join(changes)


def enable(conf: str | None = None, **options: object) -> None:
    """Install streamalloc as PyTorch's CUDA allocator for this process.

    conf: a "key:value,..." string; when None, STREAMALLOC_CONF is read. Keyword options use the same
    keys and override items of `conf` (e.g. enable(audit="warn", poison="free")).

    Raises ValueError (ConfigError) for an unknown key or a bad value, before any CUDA work;
    RuntimeError when CUDA is already initialised, when streamalloc was enabled before with other
    options, or when the native library is missing. Enabling again with identical options is a no-op.
    """
    text = _conf.conf_from_env() if conf is None else conf
    if not isinstance(text, str):
        raise TypeError(f"streamalloc.enable(): conf must be a str, got {type(text).__name__}")
    text = _conf.merge_conf(text, options)
    # torch first: it loads the CUDA runtime and libtorch that both native paths link against (a pip
    # torch carries its own libcudart). Importing it does no CUDA work.
    torch = _import_torch_with_cuda()
    with _state.lock:
        path = _choose_path()
        try:
            canonical = path.canonical(text)
            if _state.enabled_conf is None:
                path.validate(text)
        except _native.ConfigError as error:
            raise _native.ConfigError(_name_the_source(str(error), options, conf is not None)) from None
        if _state.enabled_conf is not None:
            if canonical == _state.enabled_conf:
                return
            raise RuntimeError(
                "streamalloc is already enabled with other options ("
                f"{_describe_difference(_state.enabled_conf, canonical)}). The allocator's options are fixed "
                "for the life of the process: call enable() once, or again with the same options.")
        if _conf.conf_to_dict(canonical).get("backend") == "sim":
            raise _native.ConfigError(
                "streamalloc: backend:sim simulates a device in host memory and cannot serve PyTorch's CUDA "
                "tensors; use backend:cuda or backend:auto with PyTorch")
        if torch.cuda.is_initialized():
            raise RuntimeError(TOO_LATE_MESSAGE)
        path.install(text)
        _state.enabled_conf = canonical
        if _conf.conf_to_dict(canonical).get("check_sync") in ("1", "true"):
            _sync_trace.forward_to(path)


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

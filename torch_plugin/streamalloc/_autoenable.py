"""STREAMALLOC_ENABLE=1: enable streamalloc in every Python process of a job, with no code change.

The installed package puts `streamalloc-autoenable.pth` into site-packages. Python runs its one line
at every interpreter start; the line checks os.environ itself and imports this module only when
STREAMALLOC_ENABLE is set to something other than "" or "0", so other processes pay one dictionary
lookup. Processes started by multiprocessing's spawn, torchrun, accelerate, Lightning or Ray start a
fresh interpreter with the job's environment, so they all come through here.

This module does not import torch. It puts a finder at the front of sys.meta_path that waits for the
top-level `torch` import, lets the normal finders locate torch, and wraps that spec's exec_module:
once torch/__init__.py has run to the end, streamalloc.enable() runs (options from STREAMALLOC_CONF),
before the program can make its first CUDA tensor. The finder then removes itself. Why not a hook on
CUDA's lazy init: enable() must run before that init (PyTorch picks its allocator there), and torch's
lazy-init callbacks run inside it, too late to swap the allocator.

A failure to enable (no CUDA build of torch, a bad option, the native library missing) is printed to
stderr with the reason and never breaks `import torch`; `outcome()` returns what happened.
"""

from __future__ import annotations

import os
import sys

SWITCH_VARIABLE = "STREAMALLOC_ENABLE"

# None: torch not imported yet; "enabled"; "explicit" (torch was imported by an enable() call, the
# launcher's included, which installs the allocator with its own options); or "failed: <reason>".
_outcome: str | None = None


def switch_is_set(environ=os.environ) -> bool:
    return environ.get(SWITCH_VARIABLE, "") not in ("", "0")


def outcome() -> str | None:
    """What the switch did in this process: None before torch was imported, "enabled", "explicit"
    (an explicit streamalloc.enable(), or the launcher, imported torch and installed the allocator itself),
    or "failed: ..."."""
    return _outcome


# True while streamalloc's own enable (streamalloc.enable(), or the launcher's) imports torch: that call
# installs the allocator with the options it was given, so the hook must not install first.
_explicit_import = False


class explicit_torch_import:
    """Context manager for an explicit enable's `import torch` (streamalloc/_enable.py): the hook then
    leaves the installing to that call, whose options win over STREAMALLOC_CONF."""

    def __enter__(self):
        global _explicit_import
        self._outer = _explicit_import
        _explicit_import = True
        return self

    def __exit__(self, *exc):
        global _explicit_import
        _explicit_import = self._outer
        return False


def _enable_now() -> None:
    global _outcome
    if _outcome is not None:
        return
    _outcome = "pending"
    try:
        from . import _enable

        _enable.enable()
        _outcome = "enabled"
    except Exception as error:  # never break the program's `import torch`
        _outcome = f"failed: {error}"
        print(f"streamalloc: {SWITCH_VARIABLE} is set but streamalloc was not enabled in this process: {error}",
              file=sys.stderr)


def _torch_imported(explicit: bool) -> None:
    global _outcome
    if explicit:
        _outcome = "explicit"
    else:
        _enable_now()


class _TorchImportHook:
    """A meta-path finder that only watches for `torch`; it never loads anything itself."""

    _busy = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch" or self._busy:
            return None
        self._busy = True
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):
            try:
                original(module)
            finally:
                # This loader instance belongs to torch's spec alone: restore it either way.
                try:
                    del loader.exec_module
                except AttributeError:
                    pass
            _remove()
            _torch_imported(explicit=_explicit_import)

        loader.exec_module = exec_module
        return spec


_hook = _TorchImportHook()


def _remove() -> None:
    try:
        sys.meta_path.remove(_hook)
    except ValueError:
        pass


def install() -> None:
    """Enable streamalloc as soon as torch is imported (at once if it already is)."""
    if "torch" in sys.modules:
        _enable_now()
    elif _hook not in sys.meta_path:
        sys.meta_path.insert(0, _hook)


if switch_is_set():
    install()

"""pytest setup for the streamalloc Python package.

The package is imported from the source tree (torch_plugin/), and its native libraries from a
build's library directory: STREAMALLOC_LIBRARY_DIR when set, else <STREAMALLOC_BUILD_DIR>/lib
(default: <repo>/build/lib). Without either, an installed streamalloc (pip install ./torch_plugin)
is used as it is. The same settings are exported to the environment, so the subprocesses that GPU
tests run (the allocator is chosen once per process) see the same package and libraries.
"""

import importlib.util
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE_SOURCE = REPO / "torch_plugin"


def _configure_paths() -> None:
    if not os.environ.get("STREAMALLOC_LIBRARY_DIR"):
        build_lib = Path(os.environ.get("STREAMALLOC_BUILD_DIR", REPO / "build")) / "lib"
        installed = importlib.util.find_spec("streamalloc")
        installed_dir = Path(installed.origin).parent if installed and installed.origin else None
        if not build_lib.is_dir() and installed_dir is not None and installed_dir != PACKAGE_SOURCE / "streamalloc":
            return  # a pip-installed package with its libraries beside it
        os.environ["STREAMALLOC_LIBRARY_DIR"] = str(build_lib)
    sys.path.insert(0, str(PACKAGE_SOURCE))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PACKAGE_SOURCE), os.environ.get("PYTHONPATH", "")) if p)


_configure_paths()

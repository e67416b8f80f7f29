"""The launcher: enable streamalloc, then run a script or module the way `python` would.

    python -m streamalloc [options] script.py [args ...]
    python -m streamalloc [options] -m module [args ...]

The program sees the argv, __name__ == "__main__", sys.path[0] and exit status it would see under
plain `python`. Enabling does no CUDA work (PyTorch creates the allocator at its lazy CUDA init), so
the program may still fork, set CUDA_VISIBLE_DEVICES, and so on. Under torchrun, use
`torchrun [torchrun options] -m streamalloc [options] script.py [args]` so that every worker runs
through the launcher.
"""

from __future__ import annotations

import os
import runpy
import sys
from dataclasses import dataclass, field

from . import _conf

USAGE = """\
usage: python -m streamalloc [--conf CONF] [--report] [--dump FILE] script.py [args ...]
       python -m streamalloc [--conf CONF] [--report] [--dump FILE] -m module [args ...]

Runs the program with streamalloc as PyTorch's CUDA allocator.

options:
  --conf CONF   streamalloc options, "key:value,..." (default: $STREAMALLOC_CONF); also exported
                as STREAMALLOC_CONF to the program and its children
  --report      print streamalloc's statistics to stderr when the program ends
  --dump FILE   write streamalloc.dump(FILE) when the program ends
  -h, --help    show this help
"""


class UsageError(Exception):
    pass


@dataclass
class LaunchArgs:
    conf: str | None = None
    report: bool = False
    dump: str | None = None
    help: bool = False
    module: str | None = None
    script: str | None = None
    args: list[str] = field(default_factory=list)


def parse_args(argv: list[str]) -> LaunchArgs:
    """Parse the launcher's own options; everything after the script (or -m module) is the program's."""
    parsed = LaunchArgs()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            parsed.help = True
            return parsed
        if arg == "--report":
            parsed.report = True
        elif arg in ("--conf", "--dump"):
            if i + 1 >= len(argv):
                raise UsageError(f"{arg} needs a value")
            setattr(parsed, arg[2:], argv[i + 1])
            i += 1
        elif arg.startswith("--conf="):
            parsed.conf = arg[len("--conf="):]
        elif arg.startswith("--dump="):
            parsed.dump = arg[len("--dump="):]
        elif arg == "-m":
            if i + 1 >= len(argv):
                raise UsageError("-m needs a module name")
            parsed.module = argv[i + 1]
            parsed.args = argv[i + 2:]
            return parsed
        elif arg.startswith("-m") and len(arg) > 2:  # -mmodule, as python accepts
            parsed.module = arg[2:]
            parsed.args = argv[i + 1:]
            return parsed
        elif arg == "--":
            if i + 1 >= len(argv):
                raise UsageError("no script after --")
            parsed.script = argv[i + 1]
            parsed.args = argv[i + 2:]
            return parsed
        elif arg.startswith("-"):
            raise UsageError(f"unknown option {arg}")
        else:
            parsed.script = arg
            parsed.args = argv[i + 1:]
            return parsed
        i += 1
    raise UsageError("no script or -m module to run")


def _run(parsed: LaunchArgs) -> None:
    if parsed.module is not None:
        # As `python -m`: sys.path[0] stays the working directory; argv[0] becomes the module's file.
        sys.argv = [parsed.module, *parsed.args]
        runpy.run_module(parsed.module, run_name="__main__", alter_sys=True)
    else:
        # As `python script.py`: sys.path[0] is the script's directory, argv[0] the script as given.
        sys.argv = [parsed.script, *parsed.args]
        sys.path[0] = os.path.dirname(os.path.abspath(parsed.script))
        runpy.run_path(parsed.script, run_name="__main__")


def _finish(parsed: LaunchArgs) -> None:
    from . import _enable, _inspect, report

    if parsed.dump:
        _inspect.dump(parsed.dump)
    if parsed.report:
        snap = _inspect.snapshot()
        devices = range(snap.get("streamalloc", {}).get("devices", 0))
        text = "\n".join(report.format_stats(_inspect.stats(d), d) for d in devices)
        print(f"streamalloc ({_enable.active_path()}): {_enable.enabled_conf() or '(defaults)'}\n"
              f"{text or 'no statistics (CUDA was never initialised)'}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        parsed = parse_args(argv)
    except UsageError as error:
        print(f"streamalloc: {error}\n\n{USAGE}", end="", file=sys.stderr)
        return 2
    if parsed.help:
        print(USAGE, end="")
        return 0
    if parsed.script is not None and not os.path.exists(parsed.script):
        print(f"streamalloc: can't open file {parsed.script!r}: no such file", file=sys.stderr)
        return 2
    from . import _enable

    try:
        if parsed.conf is None:
            _enable.enable()  # STREAMALLOC_CONF
        else:
            _enable.enable_from(parsed.conf, "--conf")
    except (RuntimeError, ValueError, TypeError) as error:
        print(error, file=sys.stderr)  # streamalloc's messages carry their own "streamalloc" prefix
        return 2
    if parsed.conf is not None:
        os.environ[_conf.CONF_VARIABLE] = parsed.conf  # for the program and its children
    try:
        _run(parsed)
    finally:
        if parsed.report or parsed.dump:
            try:
                _finish(parsed)
            except Exception as error:  # never mask the program's own exit status or exception
                print(f"streamalloc: could not write the report: {error}", file=sys.stderr)
    return 0

"""Configuration strings: the "key:value,key:value" syntax of STREAMALLOC_CONF.

The native library owns the option table (names, accepted values, help) and the parser: enable()
asks it to resolve a string (streamalloc_resolve_conf(), or the extension's resolve_conf()). This
module only reads the environment for the Python entry point and spells keyword arguments in the conf
syntax. It never imports torch.
"""

from __future__ import annotations

import os
from typing import Mapping

CONF_VARIABLE = "STREAMALLOC_CONF"


def conf_from_env(environ: Mapping[str, str] | None = None) -> str:
    """The STREAMALLOC_CONF of `environ` (default os.environ), or "" when unset. The Python side's one
    read of it: enable() calls it when given no conf string."""
    return (os.environ if environ is None else environ).get(CONF_VARIABLE, "")


def format_value(key: str, value: object) -> str:
    """One keyword argument's value as the conf syntax spells it.

    bool -> "1"/"0" (before int: bool is an int), numbers -> str(), strings as given. A comma or a
    newline would split the item, so it is rejected here with the key named.
    """
    if isinstance(value, bool):
        text = "1" if value else "0"
    elif isinstance(value, (int, float, str)):
        text = str(value)
    else:
        raise TypeError(
            f"streamalloc: option '{key}' got a {type(value).__name__}; "
            "pass a str, int, float or bool (the same text STREAMALLOC_CONF would hold)"
        )
    if "," in text or "\n" in text:
        raise ValueError(
            f"streamalloc: value {text!r} for option '{key}' contains ',' or a newline, which "
            "separate options in STREAMALLOC_CONF; pass a value without them"
        )
    return text.strip()


def options_conf(options: Mapping[str, object]) -> str:
    """Keyword options as one conf string, in the order given."""
    items = []
    for key, value in options.items():
        name = str(key).strip()
        if not name or ":" in name or "," in name:
            raise ValueError(f"streamalloc: {key!r} is not an option name")
        items.append(f"{name}:{format_value(name, value)}")
    return ",".join(items)


def _key_of(item: str) -> str | None:
    key, sep, _ = item.partition(":")
    return key.strip() if sep else None


def conf_keys(conf: str) -> set[str]:
    """The keys of the key:value items of `conf`."""
    return {key for key in map(_key_of, conf.split(",")) if key}


def merge_conf(conf: str, options: Mapping[str, object]) -> str:
    """`conf` with every key of `options` set to its value, without asking the native library.

    Keyword options win over items of `conf` with the same key, as in enable(audit="warn") over
    audit:off from STREAMALLOC_CONF. Items that are not key:value stay as they are so that the native
    parser reports them; values are validated natively too. (enable() itself resolves the two strings
    with the native parser, which names where a bad item came from.)
    """
    overrides = options_conf(options)
    keys = conf_keys(overrides)
    kept = [item.strip() for item in conf.split(",") if item.strip() and _key_of(item) not in keys]
    return ",".join(kept + ([overrides] if overrides else []))

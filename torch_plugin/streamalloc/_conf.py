"""Configuration strings: the "key:value,key:value" syntax of STREAMALLOC_CONF.

The native library owns the option table (names, accepted values, help); this module only does the
string plumbing that happens before the native parser sees the text: reading the environment and
merging enable(**options) keyword arguments into a conf string. It never imports torch.
"""

from __future__ import annotations

import os
from typing import Mapping

CONF_VARIABLE = "STREAMALLOC_CONF"


def conf_from_env(environ: Mapping[str, str] | None = None) -> str:
    """The STREAMALLOC_CONF of `environ` (default os.environ), or "" when unset."""
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


def split_items(conf: str) -> list[str]:
    """The non-empty items of a conf string, whitespace-trimmed, in order."""
    return [item.strip() for item in conf.split(",") if item.strip()]


def item_key(item: str) -> str | None:
    """The key of one "key:value" item, or None for a malformed item (left to the native parser,
    whose message names it)."""
    key, sep, _ = item.partition(":")
    return key.strip() if sep else None


def merge_conf(conf: str, options: Mapping[str, object]) -> str:
    """`conf` with every key of `options` set to its value.

    Keyword options win over items of `conf` with the same key, so enable(audit="warn") overrides
    audit:off from STREAMALLOC_CONF. Items that are not key:value stay as they are so that the native
    parser reports them; values are validated natively too.
    """
    overrides = {str(k).strip(): format_value(str(k), v) for k, v in options.items()}
    for key in overrides:
        if not key or ":" in key or "," in key:
            raise ValueError(f"streamalloc: {key!r} is not an option name")
    kept = [item for item in split_items(conf) if item_key(item) not in overrides]
    kept.extend(f"{key}:{value}" for key, value in overrides.items())
    return ",".join(kept)


def conf_to_dict(conf: str) -> dict[str, str]:
    """{key: value} of a conf string as written (no validation, no defaults): for reports."""
    result: dict[str, str] = {}
    for item in split_items(conf):
        key, sep, value = item.partition(":")
        if sep:
            result[key.strip()] = value.strip()
    return result

#!/usr/bin/env python3
"""Counts DeviceCache's declared member functions and fields (device_cache.hpp), and lists, for each
device_cache_*.cpp, the DeviceCache fields it uses and any direct access to the data members of Shard /
MemoryPool (component state that should be reached through operations; docs/design.md, "Components").

Usage: bench/tools/count_members.py [REPO_ROOT] [-v]   (-v also lists the member functions)
"""
import re
import sys
from pathlib import Path

args = [a for a in sys.argv[1:] if a != "-v"]
root = Path(args[0] if args else ".")
src = root / "allocator/src"
text = (src / "device_cache.hpp").read_text()


def strip(code):
    code = re.sub(r"//[^\n]*", "", code)
    code = re.sub(r"/\*.*?\*/", "", code, flags=re.S)
    code = re.sub(r'"(\\.|[^"\\])*"', '""', code)
    return code


code = strip(text)
start = re.search(r"\bclass\s+DeviceCache\b[^{;]*\{", code)
i = start.end()
depth = 1
j = i
while depth:
    if code[j] == "{":
        depth += 1
    elif code[j] == "}":
        depth -= 1
    j += 1
body = code[i : j - 1]

# Top-level declarations: text up to ';' at depth 0, or a '{...}' body at depth 0 (a function body,
# a nested class/enum body, or a brace initializer).
decls = []
cur = ""
depth = 0
paren = 0
k = 0
while k < len(body):
    c = body[k]
    if c == "(":
        paren += 1
    elif c == ")":
        paren -= 1
    if c == "{":
        if depth == 0:
            head = cur.strip()
            # a brace initializer of a field: identifier directly before '{' with no '(' in the head
            is_init = re.search(r"[A-Za-z_]\w*\s*$", head) and "(" not in re.sub(r"alignas\([^)]*\)", "", head) \
                and not re.match(r"(class|struct|enum|union)\b", head)
            d = 0
            while True:
                if body[k] == "{":
                    d += 1
                elif body[k] == "}":
                    d -= 1
                    if d == 0:
                        break
                k += 1
            if is_init:
                cur += "{}"
                k += 1
                continue
            decls.append(head + " {}")
            cur = ""
            k += 1
            # swallow a following ';' (nested class / enum)
            while k < len(body) and body[k] in " \n\t":
                k += 1
            if k < len(body) and body[k] == ";":
                k += 1
            continue
    if c == ";" and paren == 0:
        decls.append(cur.strip())
        cur = ""
        k += 1
        continue
    cur += c
    k += 1

methods, fields = [], []
for d in decls:
    d = re.sub(r"\b(public|private|protected)\s*:", "", d).strip()
    d = re.sub(r"\[\[[^\]]*\]\]", "", d)
    d = re.sub(r"alignas\([^)]*\)", "", d).strip()
    if not d:
        continue
    skipped = r"(class|struct|enum|union|using|friend|typedef|static_assert|template\s*<[^>]*>\s*(class|struct))\b"
    if re.match(skipped, d):
        continue
    if re.search(r"\boperator\s*\S+\s*\(", d) or "(" in d.split("=")[0].split("{")[0]:
        m = re.search(r"(operator\s*[^\s(]+|~?\w+)\s*\(", d)
        methods.append(m.group(1) if m else d)
    else:
        m = re.search(r"(\w+)\s*(\{\})?\s*$", d.split("=")[0].strip())
        fields.append(m.group(1) if m else d)

print(f"DeviceCache: {len(methods)} member functions, {len(fields)} fields")
if "-v" in sys.argv:
    print("methods:", ", ".join(methods))
print("fields:", ", ".join(fields))

# Component data members that device_cache_*.cpp files should not touch directly.
component_fields = {
    "Shard": [
        "hot", "hot_count", "live", "stats", "counts", "settle_list", "fences", "locked_by_device", "thread", "lock",
    ],
    "MemoryPool": ["free", "use_count", "use_on_oom", "no_split", "segments", "segment_allocator"],
}
# Receivers that are not components but have fields of the same names: a Block (`hot`), the public
# CacheCheckpoint (`segments`) and the ShardTally that validate() sums (`hot`, `live`).
not_components = {"b", "block", "checkpoint", "tally"}
shard_hpp = strip((src / "shard.hpp").read_text())
pool_hpp = strip((src / "memory_pool.hpp").read_text())
print("\nper file: DeviceCache fields used | direct component data-member accesses")
for f in sorted(src.glob("device_cache*.cpp")):
    c = strip(f.read_text())
    used = [x for x in fields if re.search(r"\b" + x + r"\b", c)]
    hits = []
    for comp, names in component_fields.items():
        hdr = shard_hpp if comp == "Shard" else pool_hpp
        for n in names:
            # only members still public data in the component's header count
            if not re.search(r"^\s*(?:[\w:<>,\s\*&]+)\b" + n + r"\b\s*(?:\{[^}]*\}|=[^;(]*)?\s*;", hdr, re.M):
                continue
            receivers = re.findall(r"(\w+)\s*(?:\.|->)" + n + r"\b(?!\s*\()", c)
            hits += [f"{comp}.{n}" for r in receivers if r not in not_components]
    summary = {}
    for h in hits:
        summary[h] = summary.get(h, 0) + 1
    print(f"  {f.name}: [{', '.join(used)}] | {', '.join(f'{k}x{v}' for k, v in sorted(summary.items())) or '-'}")

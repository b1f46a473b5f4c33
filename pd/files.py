"""Files written whole and files hashed in chunks: what the target cache (`pd.targets.train`)
and the run folder's checkpoints (`pd.train.arrays`) share. Imports nothing of pd."""

import hashlib
import os
import secrets
from pathlib import Path


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to a unique temporary name beside `path`, then rename it into place: a reader
    sees the old file or the new one, never part of one, and concurrent writers of one path each
    rename a whole file of their own (the last rename wins)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def file_sha256(path: Path) -> str:
    """The hex sha256 of the file's bytes, read in chunks (a token file may be gigabytes)."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()

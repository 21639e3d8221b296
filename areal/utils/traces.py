"""Writing a torch.profiler trace as gzipped Chrome JSON, for the trainer and the built-in server."""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

GZIP_LEVEL = 6  # zlib's default: most of level 9's ratio, far faster on traces of hundreds of MB
GZIP_CHUNK = 4 * 2**20  # zlib releases the GIL while it compresses a chunk


def export_chrome_trace_gz(profiler, path: Path) -> None:
    """Write the gzipped Chrome trace at `path`: export_chrome_trace to a plain JSON file next to
    it, then gzip that in large chunks (torch gzips `.gz` paths line by line, in Python: minutes
    for a long profile, holding the GIL). The file appears complete or not at all."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = path.with_name(f".{path.name}.json.partial")
    packed = path.with_name(f".{path.name}.partial")
    try:
        profiler.export_chrome_trace(str(raw))
        with open(raw, "rb") as fin, gzip.open(packed, "wb", compresslevel=GZIP_LEVEL) as fout:
            shutil.copyfileobj(fin, fout, GZIP_CHUNK)
        os.replace(packed, path)
    finally:
        raw.unlink(missing_ok=True)
        packed.unlink(missing_ok=True)

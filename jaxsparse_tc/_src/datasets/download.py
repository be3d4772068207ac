"""Where datasets live on disk and how missing files arrive: the cache folder and downloads."""

from __future__ import annotations

import os
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

_TIMEOUT_S = 60


def default_root() -> Path:
  """The folder datasets are kept in when no `root` is given: `~/.cache/jaxsparse_tc/datasets`.
  No environment variable moves it; pass `root=` for another place."""
  return Path.home() / ".cache" / "jaxsparse_tc" / "datasets"


def resolve_root(root) -> Path:
  """`root` as a Path (`~` expanded), or default_root() for None."""
  return default_root() if root is None else Path(root).expanduser()


def _atomic_copy(src, dest: Path) -> None:
  """Streams `src` (a readable binary file) into `dest` through a temporary file in the same
  folder, renamed into place: a reader never sees a partial file, and an interrupted transfer
  leaves none behind."""
  dest.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
  try:
    with os.fdopen(fd, "wb") as out:
      shutil.copyfileobj(src, out, length=1 << 20)
    os.replace(tmp, dest)
  except BaseException:
    os.unlink(tmp)
    raise


def download(url: str, dest: Path) -> None:
  """Fetches `url` into `dest` (atomically; see _atomic_copy)."""
  with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response:
    _atomic_copy(response, dest)


def missing_files_error(
  what: str, folder: Path, files, cause: str | None, source: str, note: str = ""
) -> FileNotFoundError:
  """The error for files that are not on disk and could not be fetched: it names every file to
  place, the folder and where they come from (`source`)."""
  lines = [f"{what}: missing {len(files)} file(s) in {folder}:"]
  lines += [f"  {folder / f}" for f in files]
  if cause is not None:
    lines.append(f"downloading them failed: {cause}")
  else:
    lines.append("(download=False: nothing was fetched)")
  lines.append(
    f"Place these files there (from {source}), or pass root= the folder that already holds "
    "the dataset." + (f" {note}" if note else "")
  )
  return FileNotFoundError("\n".join(lines))


def fetch(what: str, files, folder: Path, url: str, *, enabled: bool = True) -> None:
  """Makes sure every name of `files` is in `folder`, downloading a missing one from
  `url/<name>` unless `enabled` is False. FileNotFoundError (missing_files_error) when some
  stay missing."""
  missing = [f for f in files if not (folder / f).is_file()]
  if not missing:
    return
  base = url.rstrip("/")
  source = f"{base}/<file name>"
  if not enabled:
    raise missing_files_error(what, folder, missing, None, source)
  for f in missing:
    try:
      download(f"{base}/{f}", folder / f)
    except (urllib.error.URLError, OSError, ValueError) as e:
      # ValueError: a malformed url; URLError covers HTTP errors and unreachable hosts
      still = [g for g in files if not (folder / g).is_file()]
      raise missing_files_error(what, folder, still, f"{base}/{f}: {e}", source) from e

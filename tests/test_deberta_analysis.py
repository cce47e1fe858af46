"""DeBERTa's score terms (`bertjax.analysis.attention.disentangled`) and the report's section 10.

On tiny random DeBERTa models (odd sizes, 0.4-std weights so the position terms matter,
padded batches): the variances, shares and direct attention changes against a float64 NumPy
computation from the captured terms (whose softmax is the model's patterns), the all-layers
change against NumPy on two forwards' maps, and the direct change against a forward that
zeroes the terms at one layer only. A model without a term (c2p only; relative attention
off) gets share 0 and no change for it; a model without disentangled attention is refused
by name. Then the section's overlap with sections 1-2, its reading and page on chosen
numbers, and `bertjax report --model DIR --reduced` on a DeBERTa-v3 with its spm.model.
"""

import json
import subprocess
import sys

import numpy as np
import pytest

import bertjax
from bertjax import utils
from bertjax.analysis.attention import disentangled, patterns
from bertjax.report import page, reading, sections

SIZES = dict(
  vocab_size=67,
  hidden_size=35,
  num_hidden_layers=3,
  num_attention_heads=5,
  intermediate_size=23,
  max_position_embeddings=48,
  initializer_range=0.4,
)
CONFIGS = {
  "v3": dict(
    relative_attention=True,
    pos_att_type=("p2c", "c2p"),
    position_buckets=6,
    max_relative_positions=20,
    share_att_key=True,
    norm_rel_ebd="layer_norm",
    position_biased_input=False,
    type_vocab_size=0,
  ),
  # v2's layout: own position projections, absolute positions, token types.
  "v2": dict(
    relative_attention=True,
    pos_att_type=("c2p", "p2c"),
    max_relative_positions=16,
    type_vocab_size=2,
  ),
  "c2p_only": dict(
    relative_attention=True,
    pos_att_type=("c2p",),
    max_relative_positions=12,
    type_vocab_size=0,
    position_biased_input=False,
  ),
  "no_relative": dict(pos_att_type=("p2c", "c2p"), type_vocab_size=0),
}


def _model(key, seed=0):
  config = bertjax.BertConfig.for_family("deberta-v2", **SIZES, **CONFIGS[key])
  return config, bertjax.init(config, seed, heads=("mlm",))


def _batches(config, seed=1):
  """Two padded batches (one row padded to a single token), one width: one compile each."""
  rng = np.random.default_rng(seed)
  out = []
  for lengths, width in (([9, 5, 7, 11], 11), ([11, 1, 4, 11], 11)):
    ids = rng.integers(4, config.vocab_size, (len(lengths), width))
    mask = (np.arange(width) < np.asarray(lengths)[:, None]).astype(np.int32)
    types = rng.integers(0, 2, ids.shape) * mask if config.type_vocab_size else np.zeros_like(ids)
    out.append(
      {"input_ids": np.where(mask, ids, 0), "attention_mask": mask, "token_type_ids": types}
    )
  return out


def _softmax(z):
  e = np.exp(z - z.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _reference(params, config, batches):
  """`score_term_shares`' sums in float64 NumPy, one sequence at a time: (moments, tv_direct,
  tv_total, pairs, rows), and the largest gap between softmax(c2c + c2p + p2c) and the
  model's attention."""
  present = config.disentangled_terms
  sites = ("scores_c2c", *(f"scores_{t}" for t in present))
  layers, heads = config.depth, config.num_attention_heads
  moments, direct = np.zeros((layers, heads, 3, 3)), np.zeros((layers, heads, 3))
  total, pairs, rows, gap = np.zeros((layers, heads)), 0, 0, 0.0
  for b in batches:
    inputs = (
      b["input_ids"],
      b["attention_mask"],
      b["token_type_ids"] if config.type_vocab_size else None,
    )
    cache = bertjax.forward(params, config, *inputs, capture=(*sites, "probs")).cache
    patched = (
      bertjax.forward(
        params, config, *inputs, capture=("probs",), patch={s: (0.0, 1.0) for s in sites[1:]}
      ).cache
      if present
      else cache
    )
    for i, m in enumerate(np.asarray(b["attention_mask"], bool)):

      def cut(a, i=i, m=m):  # sequence i's real rows and keys, (L, N, n, n)
        return np.asarray(a, np.float64)[:, i][:, :, m][:, :, :, m]

      c2c, c2p, p2c = (
        cut(cache[f"scores_{t}"])
        if f"scores_{t}" in cache
        else np.zeros_like(cut(cache["scores_c2c"]))
        for t in disentangled.TERMS
      )
      dev = np.stack([x - x.mean(-1, keepdims=True) for x in (c2c, c2p, p2c)])
      moments += np.einsum("slnqk,ulnqk->lnsu", dev, dev)
      probs = cut(cache["probs"])
      gap = max(gap, np.abs(_softmax(c2c + c2p + p2c) - probs).max())
      for r, logits in enumerate((c2c + p2c, c2c + c2p, c2c)):
        direct[..., r] += 0.5 * np.abs(probs - _softmax(logits)).sum((-2, -1))
      total += 0.5 * np.abs(probs - cut(patched["probs"])).sum((-2, -1))
      pairs, rows = pairs + int(m.sum()) ** 2, rows + int(m.sum())
  return moments / pairs, direct / rows, total / rows, pairs, rows, gap


@pytest.mark.parametrize("key", list(CONFIGS))
def test_shares_and_changes_equal_numpy(key):
  config, params = _model(key)
  batches = _batches(config)
  got = disentangled.score_term_shares(params, config, batches)
  moments, direct, total, pairs, rows, gap = _reference(params, config, batches)
  assert gap < 1e-5  # the captured terms are the logits: their softmax is the model's map
  assert (
    (got.num_pairs, got.num_rows)
    == (pairs, rows)
    == (81 + 25 + 49 + 3 * 121 + 1 + 16, 9 + 5 + 7 + 3 * 11 + 1 + 4)
  )
  scale = np.abs(moments).max()
  np.testing.assert_allclose(got.moments, moments, rtol=1e-4, atol=1e-6 * scale)
  share = moments.sum(-1) / moments.sum((-2, -1))[..., None]
  np.testing.assert_allclose(got.share, share, atol=1e-5)
  np.testing.assert_allclose(got.share.sum(-1), 1.0, atol=1e-6)  # shares sum to 1
  np.testing.assert_allclose(got.positional_share, 1 - share[..., 0], atol=1e-5)
  np.testing.assert_allclose(got.tv_direct, direct, atol=1e-6)
  np.testing.assert_allclose(got.tv_total, total, atol=1e-6)
  bl = got.by_layer()
  np.testing.assert_allclose(bl["share_c2p"], share[..., 1].mean(-1), atol=1e-5)
  np.testing.assert_allclose(bl["tv_total"], total.mean(-1), atol=1e-6)
  assert got.positional_heads() == [tuple(x) for x in np.argwhere(got.positional_share > 0.5)]
  present = config.disentangled_terms
  for i, term in enumerate(disentangled.TERMS[1:], 1):
    if term in present:  # the randomised weights make every present term matter
      assert (got.variance[..., i] > 1e-3 * got.variance[..., 0]).all() and (
        got.tv_direct[..., i - 1] > 1e-3
      ).all()
    else:  # an absent term is zero: no variance, no share, removing it changes nothing
      assert (got.variance[..., i] == 0).all() and (got.share[..., i] == 0).all()
      assert (got.tv_direct[..., i - 1] < 1e-6).all()
  if not present:
    assert (got.positional_share == 0).all() and (got.tv_total == 0).all()
  if present == ("c2p",):  # removing both is removing c2p
    np.testing.assert_array_equal(got.tv_direct[..., 2], got.tv_direct[..., 0])


def test_direct_change_is_one_layer_patched():
  """tv_direct: the terms zeroed at one layer only (a per-layer patch weight), read there."""
  config, params = _model("v3")
  b = _batches(config)[1]
  got = disentangled.score_term_shares(params, config, [b])
  m = np.asarray(b["attention_mask"], bool)
  run = lambda **kw: np.asarray(
    bertjax.forward(params, config, b["input_ids"], m.astype(int), capture=("probs",), **kw).cache[
      "probs"
    ]
  )
  intact = run()
  for r, removed in enumerate((("c2p",), ("p2c",), ("c2p", "p2c"))):
    for layer in range(config.depth):
      weight = np.zeros((config.depth, 1, 1, 1, 1), np.float32)
      weight[layer] = 1
      patched = run(patch={f"scores_{t}": (0.0, weight) for t in removed})
      tv = 0.5 * np.abs(patched[layer] - intact[layer]).sum(-1)  # (B, N, T)
      np.testing.assert_allclose(
        got.tv_direct[layer, :, r], tv.transpose(1, 0, 2)[:, m].mean(-1), atol=1e-6
      )
      # Lower layers untouched, up to another compiled program's rounding (a real change: ~0.1).
      np.testing.assert_allclose(patched[:layer], intact[:layer], atol=1e-5)


def test_refuses_models_without_disentangled_attention():
  for family in ("bert", "modernbert"):
    config = bertjax.BertConfig.for_family(
      family,
      vocab_size=50,
      hidden_size=16,
      num_hidden_layers=1,
      num_attention_heads=2,
      intermediate_size=8,
    )
    with pytest.raises(ValueError, match=f"model_type='{family}' has no c2p/p2c"):
      disentangled.score_term_shares({}, config, [])
  config, params = _model("v3")
  with pytest.raises(ValueError, match="batches is empty"):
    disentangled.score_term_shares(params, config, [])


def test_section_overlap_reading_and_page():
  """The section sets its mostly positional heads against section 1's previous/next-token heads
  and section 2's diagonal heads; the reading applies its rule; the page lists them."""
  config, params = _model("v3")
  batches = [(None, b) for b in _batches(config)]
  plain = disentangled.score_term_shares(params, config, [b for _, b in batches])
  share = plain.positional_share
  order = np.argsort(-share.ravel())  # the two most positional heads, and the least
  top, low = [divmod(int(i), 5) for i in order[:2]], divmod(int(order[-1]), 5)
  prev = np.zeros((3, 5))
  prev[top[0]] = 0.9
  dominant = np.full((3, 5), patterns.PATTERN_TYPES.index("heterogeneous"))
  dominant[top[1]] = patterns.PATTERN_TYPES.index("vertical+diagonal")
  dominant[low] = patterns.PATTERN_TYPES.index("diagonal")
  clark = {"prev": prev, "next": np.zeros((3, 5))}
  d = sections.disentangled_section(params, config, batches, clark, {"dominant": dominant})
  np.testing.assert_array_equal(d["positional_share"], share)
  assert d["overlap"]["prev_next"]["heads"] == [[top[0][0] + 1, top[0][1]]]
  names = lambda hs: sorted([l + 1, h] for l, h in hs)
  assert sorted(d["overlap"]["diagonal"]["heads"]) == names([top[1], low])
  positional = share > 0.5
  found = np.zeros((3, 5), bool)
  for h in (top[1], low):
    found[h] = True
  assert d["overlap"]["diagonal"]["positional_rate"] == positional[found].mean()
  assert d["overlap"]["diagonal"]["other_rate"] == positional[~found].mean()
  # The reading's rule on the union of both sets: agrees, partly or disagrees as the rates say.
  d = json.loads(json.dumps(utils.to_json(d)))
  union = found.copy()
  union[top[0]] = True
  rate, other = positional[union].mean(), positional[~union].mean()
  expected = (
    "agrees" if rate > 0.5 and rate > other else "partly agrees" if rate > other else "disagrees"
  )
  first, second = reading.disentangled_sentences(d, "M")
  assert f"{len(d['positional_heads'])} of the 15 heads are mostly positional" in first
  assert "Of the 3 such heads here" in second
  assert reading.verdicts([second], "M") == [expected]
  r = {"disentangled": d}
  html = "\n".join(page._disentangled_html(r, {}, {"disentangled": [first, second]}))
  assert "<h2 id='disentangled'>" in html and page.html_escape(first) in html
  assert f"L{top[0][0] + 1}H{top[0][1]}" in html
  # No DeBERTa, no section: absent from the readings and the page's contents.
  assert page._disentangled_html({}, {}, {}) == [] and "#disentangled" not in page._contents(
    [k for k, _ in page.SECTIONS]
  )
  failed = sections.disentangled_section(params, config, batches, {"failed": True}, None)
  assert failed["overlap"] == {"prev_next": None, "diagonal": None}
  assert (
    "failed"
    in reading.disentangled_sentences(json.loads(json.dumps(utils.to_json(failed))), "M")[1]
  )


@pytest.mark.hf
@pytest.mark.slow
def test_report_runs_on_deberta(tmp_path):
  """`bertjax report --model DIR --reduced` on a random DeBERTa-v3 (spm.model, log buckets,
  shared keys) writes section 10 with finite numbers, its figures, reading and page."""
  pytest.importorskip("sentencepiece")
  from test_families_downstream import _texts
  from test_modern_downstream import _build, _env

  directory = _build("deberta-v2", tmp_path / "deberta", _texts())
  out = tmp_path / "report"
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "bertjax.cli",
      "report",
      "--model",
      str(directory),
      "--reduced",
      "--sections",
      "disentangled",  # with clark and patterns, which it reads
      "--out",
      str(out),
    ],
    cwd=tmp_path,
    env=_env(),
    capture_output=True,
    text=True,
    timeout=900,
    check=False,
  )
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
  doc = json.loads((out / "report.json").read_text())
  assert doc["model"]["model_type"] == "deberta-v2"
  d = doc["disentangled"]
  assert d["available"] and d["position_terms"] == ["c2p", "p2c"], d
  share = np.asarray(d["share"], float)
  assert share.shape == (3, 5, 3) and np.isfinite(share).all()
  np.testing.assert_allclose(share.sum(-1), 1.0, atol=1e-5)
  for name, values in d["by_layer"].items():
    assert np.isfinite(np.asarray(values, float)).all() and len(values) == 3, name
  assert all(np.isfinite(np.asarray(d[k], float)).all() for k in ("tv_direct", "tv_total"))
  assert d["overlap"]["prev_next"] is not None and d["overlap"]["diagonal"] is not None
  assert {"disentangled_layers", "disentangled_heads"} <= set(doc["figures"])
  assert (
    doc["readings"]["disentangled"] and "He et al. (2021)" in doc["readings"]["disentangled"][0]
  )
  html = (out / "index.html").read_text()
  assert "<h2 id='disentangled'>" in html and "href='#disentangled'" in html
  assert "Traceback" not in html and "failed" not in html.lower(), html[:2000]

"""Negation as an attribution target: the cue of a sentence, its affirmative twin, token scores.

Shared by `experiments/attribution.py` and the report's attribution section. The
quantity explained is a linear negation probe on the mean-pooled final states,
`probe = (weight (hidden, 2), bias (2,))`, read as the logit difference
`negated - affirmative`. Because the probe reads the mean of the final states, a
context-mixing method's score for input token j is the mean over real tokens i of
its final (rolled-out) matrix `M[i, j]`; the gradient methods differentiate the
probe's logit difference itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

import bertjax
from bertjax import stats
from bertjax.analysis.attribution import decompx, gradients, lrp, propagation
from bertjax.stats import spearman

CUES = ("not", "never", "no", "nothing", "nobody", "none", "nor", "neither", "cannot")
# Same-length, non-negating replacements for the affirmative twins ("t" and "'t": of "n't").
TWINS = {
  "not": "also",
  "never": "often",
  "no": "some",
  "nothing": "something",
  "nobody": "somebody",
  "none": "some",
  "nor": "and",
  "neither": "either",
  "cannot": "can",
  "t": "s",
  "'t": "'s",
}
METHODS = (
  "attention",
  "rollout",
  "flow",
  "norm",
  "globenc",
  "alti",
  "value_zeroing",
  "grad_x_input",
  "integrated_gradients",
  "attnlrp",
  "decompx",
)


def methods_for(config, methods=METHODS) -> tuple[str, ...]:
  """`methods` less those whose derivation does not cover this block: GlobEnc needs post-LN
  LayerNorm blocks (`attribution.globenc` refuses the others by family), norm analysis and
  ALTI blocks without norms on the sublayers' outputs (not Gemma's), DecompX those with an
  ungated FFN too (`decompx.check_supported`), AttnLRP's rules do not cover DeBERTa's
  disentangled attention (`lrp.check_supported`)."""
  fam = config.family
  post_ln = fam.norm == "post" and fam.norm_kind == "layernorm"
  return tuple(
    m
    for m in methods
    if (post_ln or m != "globenc")
    and (fam.norm != "sandwich" or m not in ("norm", "alti"))
    and (post_ln and fam.ffn != "gated" or m != "decompx")
    and (not config.disentangled_terms or m != "attnlrp")
  )


def _split(token: str) -> tuple[str, str]:
  """(word-start marker, lower-cased rest): byte-level BPE's "Ġ", SentencePiece's "▁", or ""."""
  for mark in ("Ġ", "▁"):
    if token.startswith(mark):
      return mark, token[len(mark) :].lower()
  return "", token.lower()


def cue_position(tok, batch, b: int) -> int | None:
  """The position of sequence b's one-token negation cue, or None (none, or several).

  A cue is one of `CUES` (after any word-start marker), or the "t" of "n't" (WordPiece
  splits "didn't" into "didn", "'", "t"; byte-level BPE into "didn", "'t").
  """
  tokens = tok.convert_ids_to_tokens(batch.input_ids[b][batch.attention_mask[b] > 0])
  words = [_split(t)[1] for t in tokens]
  hits = [
    i
    for i, w in enumerate(words)
    if w in CUES
    or w == "'t"
    or (w == "t" and i >= 2 and words[i - 1] == "'" and words[i - 2].endswith("n"))
  ]
  return hits[0] if len(hits) == 1 else None


def twin_ids(tok, batch, b: int, pos: int) -> np.ndarray | None:
  """Sequence b's ids with the cue at `pos` replaced by its twin (None if that is not one token)."""
  mark, word = _split(tok.convert_ids_to_tokens([batch.input_ids[b, pos]])[0])
  replacement = TWINS.get(word)
  try:
    (new,) = tok.convert_tokens_to_ids([mark + replacement])
  except (ValueError, TypeError):
    return None
  ids = batch.input_ids[b].copy()
  ids[pos] = new
  return ids


def cue_rank(scores: np.ndarray, cue: int, real: np.ndarray) -> int:
  """1-based rank of the cue among the `real` positions by score (ties count against it)."""
  return int((scores[real] >= scores[cue]).sum())


def pairs(tok, texts: Sequence[str], limit: int | None = None):
  """(clean, corrupted, kept texts): negated sentences and their same-length affirmative twins;
  only the first `limit` pairs when given (each sentence without a one-token cue is skipped)."""
  batch = tok.encode(list(texts))
  keep, twins = [], []
  for b in range(len(texts)):
    cue = cue_position(tok, batch, b)
    twin = None if cue is None else twin_ids(tok, batch, b, cue)
    if twin is not None:
      keep.append(b)
      twins.append(twin)
  if not keep:
    raise ValueError("none of the sentences has a one-token negation cue with a twin")
  keep, twins = keep[:limit], twins[:limit]
  width = int(batch.attention_mask[keep].sum(1).max())
  take = lambda a: np.asarray(a)[keep][:, :width]
  clean = bertjax.Batch(
    take(batch.input_ids),
    take(batch.attention_mask),
    take(batch.token_type_ids),
    take(batch.word_ids),
  )
  corrupted = dataclasses.replace(clean, input_ids=np.stack(twins)[:, :width])
  return clean, corrupted, [texts[b] for b in keep]


def token_scores(
  params, config, batch, probe, *, methods: Sequence[str] = METHODS, ig_steps: int = 32
) -> dict[str, np.ndarray]:
  """method -> (batch, seq) score of every input token for the probe's negation logit.

  Args:
    params, config: the model.
    batch: a `bertjax.Batch` (right padding).
    probe: `(weight (hidden, 2), bias (2,))` on the mean-pooled final states.
    methods: any of `METHODS` ("flow" is slow: max-flow per sentence).
    ig_steps: integrated gradients' quadrature points.
  """
  unknown = set(methods) - set(METHODS)
  if unknown:
    raise ValueError(f"methods {sorted(unknown)} are unknown; expected some of {METHODS}")
  ids, mask = jnp.asarray(batch.input_ids), jnp.asarray(batch.attention_mask)
  types = jnp.asarray(batch.token_type_ids)
  m = np.asarray(batch.attention_mask, np.float64)
  pooled = lambda mat: (
    np.einsum("bij,bi->bj", np.asarray(mat, np.float64), m) / m.sum(1, keepdims=True)
  )
  last = config.depth - 1
  matrices = {
    "attention": lambda: np.asarray(
      bertjax.forward(params, config, ids, mask, types, output_attentions=True).attentions[last]
    ).mean(1),
    "rollout": lambda: propagation.attention_rollout(params, config, ids, mask, types)[last],
    "flow": lambda: propagation.attention_flow(params, config, ids, mask, types, layers=[last])[-1],
    "norm": lambda: propagation.norm_analysis(params, config, ids, mask, types)["attn"][last],
    "globenc": lambda: propagation.globenc(params, config, ids, mask, types).rollout[last],
    "alti": lambda: propagation.alti(params, config, ids, mask, types).rollout[last],
    "value_zeroing": lambda: propagation.value_zeroing(params, config, ids, mask, types).rollout[
      last
    ],
  }
  weight, bias = (jnp.asarray(a, jnp.float32) for a in probe)
  direction, offset = weight[:, 1] - weight[:, 0], bias[1] - bias[0]

  def target(p, out):  # the probe's negated - affirmative logit on mean-pooled final states
    h = out.last_hidden_state.astype(jnp.float32)
    mf = mask.astype(h.dtype)[..., None]
    return ((h * mf).sum(1) / mf.sum(1)) @ direction + offset

  def lrp_target(p, c, out):  # the same logit, for `lrp` (its heads would take c)
    return target(p, out)

  out = {}
  for method in methods:
    if method in matrices:
      out[method] = pooled(matrices[method]())
    elif method == "decompx":  # each token's part of the pooled state, read by the probe
      parts = decompx.decompx(params, config, ids, mask, types).parts  # (B, T, K, H)
      pooled_parts = (parts * mask[:, :, None, None]).sum(1) / mask.sum(1)[:, None, None]
      out[method] = np.asarray(pooled_parts @ direction, np.float64)
    elif method == "attnlrp":  # relevance of each token's word embedding
      out[method] = np.asarray(
        lrp.attnlrp(params, config, ids, mask, types, target_fn=lrp_target).tokens, np.float64
      )
    elif method == "grad_x_input":
      out[method] = np.asarray(
        gradients.gradient_x_input(params, config, ids, mask, types, target_fn=target), np.float64
      )
    else:
      out[method] = np.asarray(
        gradients.integrated_gradients(
          params, config, ids, mask, types, target_fn=target, steps=ig_steps
        ).attributions,
        np.float64,
      )
  return out


def cue_statistics(
  params,
  config,
  tok,
  texts: Sequence[str],
  probe,
  *,
  methods: Sequence[str] = METHODS,
  ig_steps: int = 32,
  batch_size: int = 16,
  max_sentences: int | None = None,
) -> dict:
  """Where each method ranks the negation cue of each sentence, and how the methods agree.

  Returns:
    "sentences" (text, cue, tokens), "ranks" (method -> ranks), "stats" (method ->
    top1, mrr, mean_rank), "chance" (top1, mrr), "agreement" (methods, mean Spearman
    matrix of the token scores over sentences). Special tokens are excluded.
  """
  kept, rows, per_sentence = [], {k: [] for k in methods}, []
  if max_sentences:
    batch_size = min(batch_size, max_sentences)
  for start in range(0, len(texts), batch_size):
    batch = tok.encode(list(texts[start : start + batch_size]))
    cues = [cue_position(tok, batch, b) for b in range(len(batch.input_ids))]
    if all(c is None for c in cues):
      continue
    scores = token_scores(params, config, batch, probe, methods=methods, ig_steps=ig_steps)
    for b, cue in enumerate(cues):
      if cue is None:
        continue
      real = (batch.attention_mask[b] > 0) & ~np.isin(batch.input_ids[b], list(tok.special_ids))
      kept.append(
        {
          "text": texts[start + b],
          "tokens": int(real.sum()),
          "cue": tok.convert_ids_to_tokens([batch.input_ids[b, cue]])[0],
        }
      )
      per_sentence.append({k: scores[k][b][real] for k in methods})
      for k in methods:
        rows[k].append(cue_rank(scores[k][b], cue, real))
    if max_sentences and len(kept) >= max_sentences:
      break
  if not kept:
    raise ValueError("none of the sentences has exactly one one-token negation cue")
  if max_sentences:
    kept, per_sentence = kept[:max_sentences], per_sentence[:max_sentences]
    rows = {k: r[:max_sentences] for k, r in rows.items()}
  n_tokens = np.asarray([k["tokens"] for k in kept])
  stats = {
    k: {
      "top1": float(np.mean(np.asarray(r) == 1)),
      "mrr": float(np.mean(1.0 / np.asarray(r))),
      "mean_rank": float(np.mean(r)),
    }
    for k, r in rows.items()
  }
  agree = np.full((len(methods), len(methods)), np.nan)
  for i, a in enumerate(methods):
    for j, b in enumerate(methods):
      vals = np.asarray([spearman(s[a], s[b]) for s in per_sentence])
      agree[i, j] = np.nanmean(vals) if np.isfinite(vals).any() else np.nan
  return {
    "sentences": kept,
    "ranks": rows,
    "stats": stats,
    "chance": {
      "top1": float(np.mean(1.0 / n_tokens)),
      "mrr": float(np.mean([np.mean(1.0 / np.arange(1, n + 1)) for n in n_tokens])),
    },
    "agreement": {"methods": list(methods), "spearman": agree},
  }


def head_patching(params, config, tok, texts: Sequence[str], probe) -> dict:
  """Every head's output patched from each negated sentence into its twin: exact and attributed.

  Returns:
    "pairs", "clean_logit", "corrupted_logit", "exact" and "attribution" (layers,
    heads) shares of the negation logit restored, their "agreement" (Pearson,
    Spearman), and a few example sentences.
  """
  from bertjax.analysis.interventions import metrics, patching

  clean, corrupted, kept = pairs(tok, texts)
  metric = metrics.ProbeLogitDiff(np.asarray(probe[0]), np.asarray(probe[1]), "mean")
  n = len(kept)
  targets = {"answer": np.ones(n, np.int32), "distractor": np.zeros(n, np.int32)}
  exact = patching.head_patching(params, config, clean, corrupted, metric, targets=targets)
  approx = patching.attribution_patching(params, config, clean, corrupted, metric, targets=targets)
  return {
    "pairs": n,
    "clean_logit": exact.clean,
    "corrupted_logit": exact.corrupted,
    "exact": exact.normalized,
    "attribution": approx.normalized,
    "agreement": metrics.agreement(exact, approx),
    "examples": kept[:5],
  }


def circuit(
  params,
  config,
  tok,
  texts: Sequence[str],
  probe,
  *,
  steps: int = 5,
  exact_edges: int | None = None,
  sizes: Sequence[int] | None = None,
  seed: int = 0,
) -> dict:
  """The circuit that carries negation into `probe` (`circuits.discover`): every edge from the
  negated sentences to their twins scored by EAP and EAP-IG, a sample patched exactly, and the
  faithfulness of top-k circuits of growing size from the EAP-IG scores.

  Returns:
    "pairs", "edges" (the graph's), "clean_logit", "corrupted_logit", "agreement" ({"eap",
    "eap_ig"}: Pearson, Spearman and edges against exact patching), "exact_scores" and
    "scores" ({"eap", "eap_ig"}) on the edges patched exactly, "faithfulness" (top-k:
    "edges", "normalized"), "smallest" (the fewest edges keeping 80%, or None), "circuit"
    (that circuit's edges by name), "top_edges" (EAP-IG's 10 largest).
  """
  from bertjax.analysis.interventions import circuits, metrics

  clean, corrupted, kept = pairs(tok, texts)
  metric = metrics.ProbeLogitDiff(
    np.asarray(probe[0], np.float32), np.asarray(probe[1], np.float32), "mean"
  )
  n = len(kept)
  targets = {"answer": np.ones(n, np.int32), "distractor": np.zeros(n, np.int32)}
  d = circuits.discover(
    params,
    config,
    clean,
    corrupted,
    metric,
    targets=targets,
    steps=steps,
    exact_edges=exact_edges,
    sizes=sizes or circuits.SIZES,
    methods=("topk",),
    seed=seed,
  )
  g, mask, top = d["graph"], d["mask"], d["faithfulness"]["topk"]
  return {
    "pairs": n,
    "edges": int(g.valid.sum()),
    "clean_logit": float(d["eap_ig"].clean),
    "corrupted_logit": float(d["eap_ig"].corrupted),
    "agreement": d["agreement"],
    "exact_scores": d["exact"].values[mask],
    "scores": {k: d[k].values[mask] for k in ("eap", "eap_ig")},
    "faithfulness": {"edges": top["edges"], "normalized": top["normalized"]},
    "smallest": d["smallest"]["topk"],
    "circuit": []
    if d["circuit"] is None
    else [g.edge_name(s, t) for s, t in zip(*np.nonzero(d["circuit"]))],
    "top_edges": d["eap_ig"].top(10),
  }


# The probe the experiments fit ----------------------------------------------------------


def fit_probe(features: np.ndarray, labels: np.ndarray, l2: float = 1e-2):
  """The negation probe: L2-regularised logistic regression by BFGS on standardised pooled
  features (`pooled_features`); returns `(w, b, mu, sd)` (`probe_weights` turns them into the
  `(weight, bias)` that `ProbeLogitDiff` and the analyses here read)."""
  import jax
  import jax.numpy as jnp
  from jax.scipy.optimize import minimize

  mu, sd = features.mean(0), features.std(0) + 1e-6
  x = jnp.asarray((features - mu) / sd)
  y = jnp.asarray(labels, x.dtype)

  def loss(theta):
    logits = x @ theta[:-1] + theta[-1]
    return jnp.mean(jax.nn.softplus(logits) - y * logits) + l2 * jnp.sum(theta[:-1] ** 2)

  theta = minimize(loss, jnp.zeros(x.shape[1] + 1, x.dtype), method="BFGS").x
  return np.asarray(theta[:-1]), float(theta[-1]), mu, sd


def pooled_features(params, config, tok, sentences):
  """(features, labels): each sentence's mean-pooled final states (float64) and whether it
  is negated, what the probe is fitted on."""
  batch = tok.encode([s.text for s in sentences])
  hidden = np.asarray(
    bertjax.forward(
      params, config, batch.input_ids, batch.attention_mask, batch.token_type_ids
    ).last_hidden_state,
    np.float64,
  )
  return (stats.mean_pool(hidden, batch.attention_mask), np.asarray([s.negated for s in sentences]))


def probe_weights(w, b, mu, sd):
  """The standardised logistic probe as `(weight (hidden, 2), bias (2,))` on raw pooled states."""
  return np.stack([np.zeros_like(w), w / sd], 1), np.asarray([0.0, b - (mu / sd) @ w])


def probe_metric(params, config, tok, sentences):
  """The negation probe fitted on `sentences` (`pooled_features`, `fit_probe`) as the metric
  the circuit analyses read: `ProbeLogitDiff` (float32) of negated - affirmative on the
  mean-pooled final states."""
  from bertjax.analysis.interventions import metrics

  w, b = probe_weights(*fit_probe(*pooled_features(params, config, tok, sentences)))
  return metrics.ProbeLogitDiff(w.astype(np.float32), b.astype(np.float32), pooling="mean")

"""Which token-attribution method finds the negation cue, and which heads carry negation?

Run:
  ./run.sh experiment attribution
  .venv/bin/python experiments/attribution.py [--smoke] [--out DIR | --update-results]
      [--model DIR_OR_ID] [--seed N]

Model: all-MiniLM-L6-v2 (or `--model`). Data: the project's own labelled sentences
(`bertjax/resources/sentences.tsv`, 131 negated of 385); needs no download.

The quantity explained is a negation probe: a logistic regression fitted (L2, BFGS) on
the frozen model's mean-pooled final states of every sentence but a held-out fifth. Its
logit is the target of the gradient methods, and, because it reads the mean of the
final states, a context-mixing method's score for input token j is the mean over real
tokens i of its final (rolled-out) matrix `M[i, j]`.

(a) Token attribution (`bertjax.analysis.attribution`), on every held-out-or-not negated
    sentence whose negation cue ("not", "never", "no", "nothing", "nobody", "none",
    "nor", "neither", "cannot", or the "t" of "n't") is one token: raw attention of the
    last block (heads averaged), attention rollout and, last block only, attention flow
    (Abnar & Zuidema 2020), the norm-based Attn-N of the last block (Kobayashi et al.
    2020), GlobEnc (Modarressi et al. 2022), ALTI (Ferrando et al. 2022), value zeroing
    (Mohebbi et al. 2023), gradient x input and integrated gradients (Sundararajan et
    al. 2017). Per method: how often the cue ranks first among the sentence's word
    pieces (special tokens excluded), its mean reciprocal rank, the chance level (mean
    1/n), and the agreement between methods (Spearman correlation of the token scores,
    averaged over sentences).
(b) Patching (`bertjax.analysis.patching`): each negated sentence against its
    affirmative twin, the cue replaced by a word of the same length in tokens ("not" ->
    "also", "never" -> "often", ...), so positions align. Clean run: the negated
    sentence; corrupted: the twin. Patching one head's output (`head_out`) from the
    clean run into the corrupted one, for every (layer, head) in one compiled sweep,
    measures how much of the probe's negation logit that head restores, normalised to
    (patched - corrupted) / (clean - corrupted); attribution patching (the gradient
    approximation) is computed beside it, and their agreement reported.

The full run takes a few minutes of CPU time (attention flow dominates); `--smoke` uses
a tiny random BERT with MiniLM's vocabulary and six sentences (its numbers are not
findings).
"""

from __future__ import annotations

import dataclasses
import sys
import time

import common
import numpy as np

PAPER_NORM = "Kobayashi et al. 2020; Ferrando et al. 2022; Mohebbi et al. 2023"
PAPER_PATCH = "Nanda 2023; Syed et al. 2023"
NAME = "attribution"
CUES = ("not", "never", "no", "nothing", "nobody", "none", "nor", "neither", "cannot")
# Same-length, non-negating replacements for the affirmative twins.
TWINS = {"not": "also", "never": "often", "no": "some", "nothing": "something",
         "nobody": "somebody", "none": "some", "nor": "and", "neither": "either",
         "cannot": "can", "t": "s"}
METHODS = ("attention", "rollout", "flow", "norm", "globenc", "alti", "value_zeroing",
           "grad_x_input", "integrated_gradients")
SMOKE_MODEL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=64, max_position_embeddings=128)


@dataclasses.dataclass(frozen=True)
class Settings:
  max_sentences: int | None  # None: every negated sentence with a one-token cue
  ig_steps: int
  flow: bool
  batch: int


FULL = Settings(max_sentences=None, ig_steps=32, flow=True, batch=16)
SMOKE = Settings(max_sentences=6, ig_steps=8, flow=True, batch=6)


def _smoke_model():
  import bertjax

  tok = bertjax.Tokenizer.from_pretrained(bertjax.minilm_path())
  config = bertjax.BertConfig(vocab_size=tok.vocab_size, **SMOKE_MODEL)
  return config, bertjax.init(config, 0), tok, "tiny random BERT (smoke stand-in)"


def mean_pool(hidden, mask):
  m = mask.astype(hidden.dtype)[..., None]
  return (hidden * m).sum(1) / np.maximum(m.sum(1), 1)


def fit_probe(features: np.ndarray, labels: np.ndarray, l2: float = 1e-2):
  """L2-regularised logistic regression by BFGS on standardised features: (w, b, mu, sd)."""
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


def cue_position(tok, batch, b: int) -> int | None:
  """The position of the one-token negation cue in sequence b, or None."""
  tokens = tok.convert_ids_to_tokens(batch.input_ids[b][batch.attention_mask[b] > 0])
  hits = [i for i, t in enumerate(tokens) if t.lower() in CUES
          or (t == "t" and i >= 2 and tokens[i - 1] == "'" and tokens[i - 2].endswith("n"))]
  return hits[0] if len(hits) == 1 else None


def twin_ids(tok, batch, b: int, pos: int) -> np.ndarray | None:
  """Sequence b's ids with the cue replaced by its same-length twin (None if not one token)."""
  token = tok.convert_ids_to_tokens([batch.input_ids[b, pos]])[0].lower()
  replacement = TWINS.get(token)
  try:
    (new,) = tok.convert_tokens_to_ids([replacement])
  except (ValueError, TypeError):
    return None
  ids = batch.input_ids[b].copy()
  ids[pos] = new
  return ids


def ranks(scores: np.ndarray, cue: int, real: np.ndarray) -> int:
  """1-based rank of the cue among the real non-special positions by score (ties pessimistic)."""
  return int((scores[real] >= scores[cue]).sum())


def spearman(a: np.ndarray, b: np.ndarray) -> float:
  ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
  if ra.std() == 0 or rb.std() == 0:
    return float("nan")
  return float(np.corrcoef(ra, rb)[0, 1])


def token_scores(params, config, batch, probe, settings: Settings) -> dict[str, np.ndarray]:
  """(method -> (B, T)) score of each input token for the pooled representation / probe."""
  import jax.numpy as jnp

  from bertjax.analysis import attribution as attr

  ids, mask = jnp.asarray(batch.input_ids), jnp.asarray(batch.attention_mask)
  types = jnp.asarray(batch.token_type_ids)
  m = np.asarray(batch.attention_mask, np.float64)
  pooled_share = lambda mat: np.einsum("bij,bi->bj", np.asarray(mat, np.float64), m) / m.sum(1,
                                                                                              keepdims=True)
  out = {}
  import bertjax

  maps = bertjax.forward(params, config, ids, mask, types, output_attentions=True).attentions
  out["attention"] = pooled_share(np.asarray(maps[-1]).mean(1))
  out["rollout"] = pooled_share(attr.attention_rollout(params, config, ids, mask, types)[-1])
  if settings.flow:
    out["flow"] = pooled_share(attr.attention_flow(params, config, ids, mask, types,
                                                   layers=[config.depth - 1])[-1])
  norms = attr.norm_analysis(params, config, ids, mask, types)
  out["norm"] = pooled_share(norms["attn"][-1])
  out["globenc"] = pooled_share(attr.globenc(params, config, ids, mask, types).rollout[-1])
  out["alti"] = pooled_share(attr.alti(params, config, ids, mask, types).rollout[-1])
  out["value_zeroing"] = pooled_share(
      attr.value_zeroing(params, config, ids, mask, types).rollout[-1])
  w, bias, mu, sd = probe
  w_std = jnp.asarray(w / sd)
  b_std = float(bias - (mu / sd) @ w)

  def target(p, o):  # the probe's negation logit on the mean-pooled final states
    h = o.last_hidden_state.astype(jnp.float32)
    mf = mask.astype(h.dtype)[..., None]
    return ((h * mf).sum(1) / mf.sum(1)) @ w_std + b_std

  out["grad_x_input"] = np.asarray(attr.gradient_x_input(params, config, ids, mask, types,
                                                         target_fn=target))
  ig = attr.integrated_gradients(params, config, ids, mask, types, target_fn=target,
                                 steps=settings.ig_steps)
  out["integrated_gradients"] = np.asarray(ig.attributions)
  return out


def run_attribution(params, config, tok, sentences, probe, settings):
  """Per-method rank statistics of the cue and the methods' agreement."""
  negated = [s.text for s in sentences if s.negated]
  if settings.max_sentences:
    negated = negated[:settings.max_sentences * 3]
  kept, rows = [], {k: [] for k in METHODS if settings.flow or k != "flow"}
  per_sentence_scores = []
  for start in range(0, len(negated), settings.batch):
    batch = tok.encode(negated[start:start + settings.batch])
    cues = [cue_position(tok, batch, b) for b in range(len(batch.input_ids))]
    if not any(c is not None for c in cues):
      continue
    scores = token_scores(params, config, batch, probe, settings)
    for b, cue in enumerate(cues):
      if cue is None:
        continue
      real = (batch.attention_mask[b] > 0) & ~np.isin(batch.input_ids[b], list(tok.special_ids))
      kept.append({"text": negated[start + b], "cue": tok.convert_ids_to_tokens(
          [batch.input_ids[b, cue]])[0], "tokens": int(real.sum())})
      per_sentence_scores.append({k: scores[k][b][real] for k in rows})
      for k in rows:
        rows[k].append(ranks(scores[k][b], cue, real))
    if settings.max_sentences and len(kept) >= settings.max_sentences:
      break
  n_tokens = np.asarray([k["tokens"] for k in kept], np.float64)
  stats = {k: {"top1": float(np.mean(np.asarray(r) == 1)),
               "mrr": float(np.mean(1.0 / np.asarray(r))),
               "mean_rank": float(np.mean(r))} for k, r in rows.items()}
  names = list(rows)
  agree = np.full((len(names), len(names)), np.nan)
  for i, a in enumerate(names):
    for j, b in enumerate(names):
      vals = [spearman(s[a], s[b]) for s in per_sentence_scores]
      agree[i, j] = np.nanmean(vals) if np.isfinite(vals).any() else np.nan
  return {"sentences": kept, "ranks": rows, "stats": stats,
          "chance": {"top1": float(np.mean(1.0 / n_tokens)),
                     "mrr": float(np.mean([np.mean(1.0 / np.arange(1, n + 1))
                                           for n in n_tokens.astype(int)]))},
          "agreement": {"methods": names, "spearman": agree}}


def patching_pairs(tok, sentences):
  """(clean, corrupted) batches: negated sentences and their same-length affirmative twins."""
  import bertjax

  texts = [s.text for s in sentences if s.negated]
  batch = tok.encode(texts)
  keep, twins = [], []
  for b in range(len(texts)):
    cue = cue_position(tok, batch, b)
    twin = None if cue is None else twin_ids(tok, batch, b, cue)
    if twin is not None:
      keep.append(b)
      twins.append(twin)
  width = int(batch.attention_mask[keep].sum(1).max())
  take = lambda a: np.asarray(a)[keep][:, :width]
  clean = bertjax.Batch(take(batch.input_ids), take(batch.attention_mask),
                        take(batch.token_type_ids), take(batch.word_ids))
  corrupted = dataclasses.replace(clean, input_ids=np.stack(twins)[:, :width])
  return clean, corrupted, [texts[b] for b in keep]


def run_patching(params, config, tok, sentences, probe):
  """Every head's output patched from the negated run into its twin's, exact and attributed."""
  from bertjax.analysis import patching

  clean, corrupted, texts = patching_pairs(tok, sentences)
  w, bias, mu, sd = probe
  weight = np.stack([np.zeros_like(w), w / sd], 1)  # the binary probe as two classes
  metric = patching.ProbeLogitDiff(weight, np.asarray([0.0, bias - (mu / sd) @ w]), "mean")
  n = len(texts)
  targets = {"answer": np.ones(n, np.int32), "distractor": np.zeros(n, np.int32)}
  exact = patching.head_patching(params, config, clean, corrupted, metric, targets=targets)
  approx = patching.attribution_patching(params, config, clean, corrupted, metric,
                                         targets=targets)
  return {"pairs": n, "clean_logit": exact.clean, "corrupted_logit": exact.corrupted,
          "exact": exact.normalized, "attribution": approx.normalized,
          "agreement": patching.agreement(exact, approx), "examples": texts[:5]}


def patching_figure(out, res) -> str:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  exact, approx = np.asarray(res["exact"]), np.asarray(res["attribution"])
  lim = float(np.nanmax(np.abs(np.concatenate([exact.ravel(), approx.ravel()])))) or 1.0
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
  for ax, values, title in ((axes[0], exact, "exact activation patching"),
                            (axes[1], approx, "attribution patching (gradient)")):
    im = ax.imshow(values, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
    ax.set_xlabel("head")
    ax.set_ylabel("block (1 = first)")
    ax.set_yticks(range(values.shape[0]), range(1, values.shape[0] + 1))
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label="share of the negation logit restored")
  a = res["agreement"]
  fig.suptitle(f"Which heads carry negation into the affirmative twin? ({res['pairs']} pairs; "
               f"Pearson {a['pearson']:.2f}, Spearman {a['spearman']:.2f})")
  return common.savefig(fig, out, "attribution_patching")


def figure(out, res) -> str:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  names = res["agreement"]["methods"]
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
  mrr = [res["stats"][k]["mrr"] for k in names]
  top1 = [res["stats"][k]["top1"] for k in names]
  x = np.arange(len(names))
  ax1.bar(x - 0.2, mrr, 0.4, label="mean reciprocal rank")
  ax1.bar(x + 0.2, top1, 0.4, label="cue ranked first")
  ax1.axhline(res["chance"]["mrr"], color="k", ls="--", lw=1, label="chance (MRR)")
  ax1.set_xticks(x, names, rotation=40, ha="right")
  ax1.set_ylim(0, 1)
  ax1.set_title(f"Where does each method put the negation cue? ({len(res['sentences'])} "
                "sentences)")
  ax1.legend(fontsize=8)
  agree = np.asarray(res["agreement"]["spearman"], float)
  im = ax2.imshow(agree, vmin=-1, vmax=1, cmap="RdBu_r")
  ax2.set_xticks(x, names, rotation=40, ha="right")
  ax2.set_yticks(x, names)
  for i in range(len(names)):
    for j in range(len(names)):
      if np.isfinite(agree[i, j]):
        ax2.text(j, i, f"{agree[i, j]:.2f}", ha="center", va="center", fontsize=7,
                 color="white" if abs(agree[i, j]) > 0.6 else "black")
  fig.colorbar(im, ax=ax2, label="Spearman (token scores)")
  ax2.set_title("Agreement between methods")
  return common.savefig(fig, out, "attribution_methods")


def main(argv=None) -> int:
  args = common.parser(__doc__).parse_args(argv)
  t0 = time.perf_counter()
  import bertjax
  from bertjax import report

  settings = SMOKE if args.smoke else FULL
  timings: dict[str, float] = {}
  with common.timed(timings, "load"):
    config, params, tok, name = common.load_model(args, smoke=_smoke_model)
    sentences = report.load_sentences()
  with common.timed(timings, "probe"):
    batch = tok.encode([s.text for s in sentences])
    hidden = np.asarray(bertjax.forward(params, config, batch.input_ids, batch.attention_mask,
                                        batch.token_type_ids).last_hidden_state, np.float64)
    feats = mean_pool(hidden, batch.attention_mask)
    labels = np.asarray([s.negated for s in sentences])
    rng = np.random.default_rng(args.seed)
    test = rng.permutation(len(labels))[:len(labels) // 5]
    train = np.setdiff1d(np.arange(len(labels)), test)
    probe = fit_probe(feats[train], labels[train])
    w, b, mu, sd = probe
    acc = float((((feats[test] - mu) / sd @ w + b > 0) == labels[test]).mean())
  with common.timed(timings, "attribution"):
    res = run_attribution(params, config, tok, sentences, probe, settings)
  with common.timed(timings, "patching"):
    patch_res = run_patching(params, config, tok, sentences, probe)
  figures = [figure(args.out, res), patching_figure(args.out, patch_res)]
  stats = res["stats"]
  mixing = {k: stats[k]["mrr"] for k in ("globenc", "alti", "value_zeroing")}
  weights = {k: stats[k]["mrr"] for k in ("attention", "rollout") if k in stats}
  best_mixing, best_weight = max(mixing.values()), max(weights.values())
  holds = "yes" if min(mixing.values()) > best_weight else (
      "partly" if best_mixing > best_weight else "no")
  measured = (f"{name}, {len(res['sentences'])} negated sentences, MRR of the negation cue: "
              + ", ".join(f"{k} {v['mrr']:.2f}" for k, v in stats.items())
              + f" (chance {res['chance']['mrr']:.2f}); the probe reads negation with held-out "
              f"accuracy {acc:.2f}")
  findings = [common.finding(
      PAPER_NORM, "Attention weights alone misplace token importance; methods that also "
      "count value vectors, the residual and LayerNorm (norm-based, GlobEnc, ALTI, value "
      "zeroing) attribute to the tokens that matter", measured, holds)]
  a = patch_res["agreement"]
  exact = np.asarray(patch_res["exact"])
  top = np.unravel_index(np.nanargmax(exact), exact.shape)
  findings.append(common.finding(
      PAPER_PATCH, "Attribution patching (a first-order gradient estimate) approximates "
      "activation patching of attention heads well enough to rank them",
      f"{name}, every head's output patched from {patch_res['pairs']} negated sentences into "
      f"their affirmative twins (probe logit {patch_res['clean_logit']:.2f} vs "
      f"{patch_res['corrupted_logit']:.2f}): attribution vs exact patching Pearson "
      f"{a['pearson']:.2f}, Spearman {a['spearman']:.2f}; the strongest head, block "
      f"{top[0] + 1} head {top[1]}, restores {exact[top]:.2f} of the logit",
      "yes" if a["pearson"] > 0.8 else "partly" if a["pearson"] > 0.5 else "no"))
  results = {"model": name, "probe_test_accuracy": acc, **res, "patching": patch_res}
  common.write_results(NAME, args.out, results, findings=findings,
                       settings=dataclasses.asdict(settings), smoke=args.smoke,
                       seconds=time.perf_counter() - t0, figures=figures)
  return 0


if __name__ == "__main__":
  sys.exit(main())

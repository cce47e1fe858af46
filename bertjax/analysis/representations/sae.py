"""Top-k sparse autoencoders on an encoder's token activations, at any site.

Gao et al. 2024 ("Scaling and evaluating sparse autoencoders"), as their released code
(openai/sparse_autoencoder, `train.py` `FastAutoencoder`) defines it, for every site of every
family (`bertjax.SITES`, one block's value at each real token):

* encoder: `z = ReLU(TopK(W_enc^T (x - b_pre) + b_lat))`, the k largest pre-activations kept;
* decoder: `x_hat = W_dec^T z + b_pre`, every latent's decoder row of unit norm;
* loss: `mse_scale * mean((x_hat - x)^2)` with `mse_scale = 1 / mean((x - mean x)^2)` of a
  sample of the activations, plus `auxk_coef` (1/32) times the AuxK term: the `auxk` (256)
  largest pre-activations of the dead latents (no activation in the last `dead_tokens`
  tokens) reconstruct the residual `x - x_hat` (`normalized_mse`, their definition);
* init: `W_dec` is `W_enc^T` with unit rows, `W_enc` uniform in +-1/sqrt(d) (torch's
  `nn.Linear` default) then scaled so that random unit inputs around `b_pre` reconstruct
  with norm 1 on average; `b_pre` the geometric median of a sample (Weiszfeld's iteration);
* step: Adam (lr 1e-4, eps 6.25e-10), the decoder rows' gradient with its component along
  each row removed, and the rows renormalised after each step (the paper's A.1; the
  released loop renormalises before the step instead, so its decoder is unit-norm only at
  the next step's start: the two differ by one step's drift).

One jitted step does all of it (`make_step`); `train` streams activations captured with
`bertjax.forward(capture=)`, shuffled, through it (on a `jax.sharding.Mesh` the tokens of each
step are split over the mesh's row axes and the SAE is replicated). `evaluate` reports the
fraction of variance unexplained, L0, dead and dense latents; `loss_recovered` runs the model
with the site replaced by its reconstruction at one layer, against the clean model and the
site zero-ablated: `(L_zero - L_sae) / (L_zero - L_clean)`; `top_activating` lists each
latent's strongest tokens.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax import timing
from bertjax.analysis.batching import as_batch
from bertjax.model.config import BertConfig
from bertjax.model.forward import forward
from bertjax.model.sites import SITES, model_sites

Params = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class SAEConfig:
  """A top-k SAE's shape and training constants (the released code's defaults).

  Attributes:
    d_model: the site's width (hidden size, or intermediate size for `ffn_act`).
    latents: dictionary size m.
    k: latents kept per token.
    auxk: dead latents the AuxK term uses (None: no AuxK term).
    auxk_coef: its weight.
    dead_tokens: tokens without activating after which a latent counts as dead.
    lr, eps: Adam's.
  """

  d_model: int
  latents: int
  k: int = 32
  auxk: int | None = 256
  auxk_coef: float = 1 / 32
  dead_tokens: int = 10_000_000
  lr: float = 1e-4
  eps: float = 6.25e-10

  def __post_init__(self):
    for name in ("d_model", "latents", "k", "dead_tokens"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive int")
    if self.k > self.latents:
      raise ValueError(f"k={self.k} must be at most latents={self.latents}")
    if self.auxk is not None and not 1 <= self.auxk:
      raise ValueError(f"auxk={self.auxk!r} must be a positive int or None")

  @property
  def auxk_latents(self) -> int | None:
    """The dead latents the auxiliary loss reconstructs with: `auxk`, at most `latents`; None
    without the auxiliary loss."""
    return None if self.auxk is None else min(self.auxk, self.latents)


class TrainState(NamedTuple):
  """SAE parameters, Adam's state, tokens since each latent last fired, the step count."""

  params: Params
  opt_state: Any
  tokens_since: jax.Array  # (latents,) int32
  step: jax.Array


def geometric_median(x, iters: int = 200, tol: float = 1e-7) -> jax.Array:
  """The point minimising the summed Euclidean distance to the rows of `x` (n, d), by
  Weiszfeld's iteration (started at the mean; a row it lands on counts with weight 1/eps)."""
  x = jnp.asarray(x, jnp.float32)

  def body(state):
    y, _, i = state
    w = 1 / jnp.maximum(jnp.linalg.norm(x - y, axis=-1), 1e-12)
    new = (w[:, None] * x).sum(0) / w.sum()
    return new, jnp.linalg.norm(new - y) / jnp.maximum(jnp.linalg.norm(y), 1e-12), i + 1

  y, _, _ = jax.lax.while_loop(
    lambda s: (s[1] > tol) & (s[2] < iters), body, (x.mean(0), jnp.asarray(jnp.inf, jnp.float32), 0)
  )
  return y


def init(key, config: SAEConfig, sample) -> Params:
  """Fresh SAE parameters: the released code's tied init, scaled on `sample` (n, d)."""
  sample = jnp.asarray(sample, jnp.float32)
  if sample.ndim != 2 or sample.shape[1] != config.d_model:
    raise ValueError(f"sample shape {sample.shape} must be (n, d_model={config.d_model})")
  k_enc, k_x = jax.random.split(jax.random.key(key) if isinstance(key, int) else key)
  d, m = config.d_model, config.latents
  bound = 1 / np.sqrt(d)
  w_enc = jax.random.uniform(k_enc, (d, m), jnp.float32, -bound, bound)
  params = {
    "pre_bias": geometric_median(sample[:32768]),
    "W_enc": w_enc,
    "latent_bias": jnp.zeros(m, jnp.float32),
    "W_dec": unit_rows(w_enc.T),
  }
  x = jax.random.normal(k_x, (256, d), jnp.float32)
  x = x / jnp.linalg.norm(x, axis=-1, keepdims=True) + params["pre_bias"]
  norm = jnp.linalg.norm(reconstruct(params, x, config.k) - params["pre_bias"], axis=-1).mean()
  return {**params, "W_enc": params["W_enc"] / norm}


def unit_rows(w):
  """`w` (m, d) with every row scaled to unit norm."""
  return w / jnp.maximum(jnp.linalg.norm(w, axis=-1, keepdims=True), 1e-12)


def pre_activations(params: Params, x):
  """(n, m) `W_enc^T (x - b_pre) + b_lat`."""
  return (jnp.asarray(x) - params["pre_bias"]) @ params["W_enc"] + params["latent_bias"]


def encode(params: Params, x, k: int):
  """The k kept latents of each row of `x` (n, d): values (n, k) after ReLU, indices (n, k)."""
  values, indices = jax.lax.top_k(pre_activations(params, x), k)
  return jax.nn.relu(values), indices


def decode(params: Params, values, indices):
  """`W_dec^T z + b_pre` from sparse latents (values, indices), each (n, k): (n, d).

  Two ways to the same sum, chosen by the shapes: with few kept latents (64 k <= m) the k
  decoder rows of each token are gathered (n k d reads, its gradient a scatter-add); with
  more (AuxK's 256) the latents are scattered into a dense (n, m) array and multiplied (n m d
  multiply-adds). Measured on a 2-core Xeon for one gradient of the reconstruction, n =
  1,024: k = 32, m = 12,288 gathered 408 ms, dense 623 ms; k = 256 gathered 901 ms, dense
  690 ms; k = 32, m = 3,072 level (81 and 78 ms)."""
  w = params["W_dec"]
  if 64 * values.shape[-1] <= w.shape[0]:
    return jnp.einsum("nk,nkd->nd", values.astype(w.dtype), w[indices]) + params["pre_bias"]
  dense = dense_latents(values, indices, w.shape[0])
  return dense.astype(w.dtype) @ w + params["pre_bias"]


def reconstruct(params: Params, x, k: int):
  """The SAE's reconstruction of `x` (n, d)."""
  return decode(params, *encode(params, x, k))


def dense_latents(values, indices, latents: int):
  """The sparse latents as a dense (n, latents) array."""
  n = values.shape[0]
  return jnp.zeros((n, latents), values.dtype).at[jnp.arange(n)[:, None], indices].set(values)


def _mse(a, b):
  return jnp.mean((a - b) ** 2)


def loss_terms(
  params: Params, x, config: SAEConfig, dead=None, mse_scale=1.0, *, tokens_since=None
) -> dict[str, jax.Array]:
  """The training loss and its parts for activations `x` (n, d).

  Args:
    dead: bool (latents,): the latents the AuxK term may use; or None with `tokens_since`.
    mse_scale: 1 / mean((x - mean x)^2) of a sample (`mse_scale`).
    tokens_since: int (latents,): tokens since each latent last fired. As the released
      code does, this batch updates it first (a latent fires when a kept value exceeds
      1e-3), and `dead` is then where it exceeds `config.dead_tokens`.

  Returns:
    "loss" (what is minimised), "mse" (scaled), "auxk" (before `auxk_coef`), "dead" (the
    mask used), and with `tokens_since` its updated value (saturated just past the
    threshold, so it never overflows).
  """
  x = jnp.asarray(x, jnp.float32)
  pre = pre_activations(params, x)
  values, indices = jax.lax.top_k(pre, config.k)
  terms = {}
  if tokens_since is not None:
    fired = (
      jnp.zeros(config.latents, jnp.int32)
      .at[indices.reshape(-1)]
      .add((values > 1e-3).reshape(-1).astype(jnp.int32))
      > 0
    )
    since = jnp.where(fired, 0, tokens_since) + x.shape[0]
    terms["tokens_since"] = jnp.minimum(since, config.dead_tokens + x.shape[0])
    dead = since > config.dead_tokens
  values = jax.nn.relu(values)
  recon = decode(params, values, indices)
  mse = mse_scale * _mse(recon, x)
  auxk = jnp.zeros((), jnp.float32)
  if config.auxk_latents is not None:
    target = x - jax.lax.stop_gradient(recon) + jax.lax.stop_gradient(params["pre_bias"])

    def aux_term(p, pre):
      pre_dead = pre * dead.astype(jnp.float32)
      aux_values, aux_indices = jax.lax.top_k(pre_dead, config.auxk_latents)
      aux_recon = decode(p, jax.nn.relu(aux_values), aux_indices)
      term = _mse(aux_recon, target) / _mse(jnp.broadcast_to(target.mean(0), target.shape), target)
      return jnp.nan_to_num(term, nan=0.0, posinf=0.0, neginf=0.0)

    def idle_term(p, pre):
      # No dead latent: every kept value is ReLU(0) = 0 and the reconstruction is b_pre, so
      # the term is mse(b_pre, target) / var(target) (its gradient reaches b_pre only),
      # written in closed form to skip a top-k over every latent.
      term = _mse(jnp.broadcast_to(p["pre_bias"], target.shape), target) / _mse(
        jnp.broadcast_to(target.mean(0), target.shape), target
      )
      return jnp.nan_to_num(term, nan=0.0, posinf=0.0, neginf=0.0)

    auxk = jax.lax.cond(jnp.any(dead), aux_term, idle_term, params, pre)
  return {**terms, "loss": mse + config.auxk_coef * auxk, "mse": mse, "auxk": auxk, "dead": dead}


def mse_scale(sample) -> float:
  """`1 / mean((x - mean x)^2)` of a sample (n, d), the released code's MSE normaliser."""
  x = np.asarray(sample, np.float64)
  return float(1 / np.mean((x - x.mean(0)) ** 2))


def optimizer(config: SAEConfig) -> optax.GradientTransformation:
  """Adam with the released code's constants."""
  return optax.adam(config.lr, eps=config.eps)


def start(params: Params, config: SAEConfig) -> TrainState:
  """The training state of fresh (or loaded) parameters."""
  return TrainState(
    params,
    optimizer(config).init(params),
    jnp.zeros(config.latents, jnp.int32),
    jnp.zeros((), jnp.int32),
  )


def make_step(config: SAEConfig) -> Callable:
  """One compiled training step: `step(state, x, mse_scale) -> (state, metrics)`.

  `x` (n, d) are n token activations. The decoder's gradient loses its component along
  each (unit) row, Adam steps, the rows are renormalised, and `tokens_since` counts the
  tokens since each latent last fired (`loss_terms`). The state is donated: the arrays
  passed in (those given to `start` too) are consumed; keep a copy to reuse them.
  """
  opt = optimizer(config)

  @functools.partial(jax.jit, donate_argnums=0)
  def step(state: TrainState, x, scale):
    def loss(p):
      terms = loss_terms(p, x, config, None, scale, tokens_since=state.tokens_since)
      return terms["loss"], terms

    (_, terms), grads = jax.value_and_grad(loss, has_aux=True)(state.params)
    w = state.params["W_dec"]
    g = grads["W_dec"]
    grads = {**grads, "W_dec": g - jnp.sum(g * w, -1, keepdims=True) * w}
    updates, opt_state = opt.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    params = {**params, "W_dec": unit_rows(params["W_dec"])}
    metrics = {
      "loss": terms["loss"],
      "mse": terms["mse"],
      "auxk": terms["auxk"],
      "dead": jnp.mean(terms["dead"]),
    }
    return TrainState(params, opt_state, terms["tokens_since"], state.step + 1), metrics

  return step


# Activations of a model ------------------------------------------------------


def _check_site(config: BertConfig, site: str, layer: int | None) -> None:
  if site not in model_sites(config):
    raise ValueError(
      f"site={site!r} is not a site of a {config.model_type} model; expected one "
      f"of {model_sites(config)}"
    )
  if site != "embeddings" and (layer is None or not 0 <= layer < config.depth):
    raise ValueError(
      f"layer={layer!r} must be a block index in [0, {config.depth}) for site {site!r}"
    )
  if site in ("probs", "scores_c2c", "scores_c2p", "scores_p2c"):
    raise ValueError(
      f"site={site!r} is an attention map, not a token activation; an SAE reads "
      "a token's vector (a head's q, k, v, head_out flatten its heads)"
    )


def site_width(config: BertConfig, site: str) -> int:
  """The width of one token's activation at `site` (heads and head_dim flattened)."""
  axes = SITES[site][0].split()[2:]
  sizes = dict(
    hidden=config.hidden_size,
    heads=config.num_attention_heads,
    kv_heads=config.kv_heads,
    head_dim=config.head_dim,
    intermediate=config.ffn_size,
  )
  return int(np.prod([sizes[a] for a in axes]))


def _site_rows(
  params: Params, config: BertConfig, b: dict, site: str, layer: int | tuple[int, ...] | None
):
  """One batch's site at its real tokens, (tokens, width) float32 (row-major over the
  batch's real positions; (layers, tokens, width) for a tuple of layers), with the batch's ids
  and real-token mask as NumPy."""
  o = forward(
    params, config, b["input_ids"], b["attention_mask"], b["token_type_ids"], capture=(site,)
  )
  ids, real = np.asarray(b["input_ids"]), np.asarray(b["attention_mask"]) > 0
  if isinstance(layer, tuple):  # (layers, tokens, width), from the one pass
    rows = np.asarray(o.cache[site][np.asarray(layer)], np.float32)[:, real]
    return rows.reshape(*rows.shape[:2], -1), ids, real
  value = o.cache[site] if site == "embeddings" else o.cache[site][layer]
  rows = np.asarray(value, np.float32)[real]
  return rows.reshape(len(rows), -1), ids, real


def activations(
  params: Params,
  config: BertConfig,
  batches: Iterable,
  site: str,
  layer: int | None = None,
  *,
  max_tokens: int | None = None,
) -> np.ndarray:
  """The site's activation at every real token of `batches`, (n_tokens, width) float32.

  Args:
    batches: `Tokenizer` batches (or dicts with input_ids, attention_mask).
    site: a token site (`bertjax.SITES`; not an attention map).
    layer: the block (0-based) for a block site; None for "embeddings".
    max_tokens: stop after this many tokens.
  """
  _check_site(config, site, layer)
  return _gather(params, config, batches, site, layer, max_tokens)[0]


def activations_by_layer(
  params: Params,
  config: BertConfig,
  batches: Iterable,
  site: str,
  layers: Sequence[int],
  *,
  max_tokens: int | None = None,
) -> np.ndarray:
  """`activations` at each of the block site's `layers`, (len(layers), n_tokens, width)
  float32, from one forward pass per batch (not one per layer)."""
  layers = tuple(int(i) for i in layers)
  if not layers:
    raise ValueError("layers is empty: name at least one block")
  for layer in layers:
    _check_site(config, site, layer)
  return _gather(params, config, batches, site, layers, max_tokens)


def _gather(params, config, batches, site, layer, max_tokens) -> np.ndarray:
  # (layers, n, width): one layer (an int or None) as a single row of layers.
  out, total = [], 0
  for batch in batches:
    rows, _, _ = _site_rows(params, config, as_batch(batch), site, layer)
    rows = rows if isinstance(layer, tuple) else rows[None]
    out.append(rows)
    total += rows.shape[1]
    if max_tokens is not None and total >= max_tokens:
      break
  width, count = site_width(config, site), len(layer) if isinstance(layer, tuple) else 1
  x = np.concatenate(out, 1) if out else np.zeros((count, 0, width), np.float32)
  return x[:, :max_tokens] if max_tokens is not None else x


def train(
  acts,
  config: SAEConfig,
  *,
  steps: int,
  batch_tokens: int = 4096,
  seed: int = 0,
  mesh=None,
  progress: bool = True,
  log_every: int = 0,
) -> tuple[TrainState, list]:
  """Trains a top-k SAE on activations `acts` (n, d): `steps` steps of `batch_tokens` rows,
  drawn in shuffled epochs.

  Args:
    mesh: a `jax.sharding.Mesh`: each step's rows split over its row axes, the SAE
      replicated (fsdp-sharded where the mesh has fsdp > 1; `bertjax.mesh.
      analysis_mesh`); `batch_tokens` must divide evenly.
    progress: a tqdm bar.
    log_every: keep the metrics of every this-many steps (0: of the last step only).

  Returns:
    (the final `TrainState`, a list of (step, metrics) as floats).
  """
  acts = np.asarray(acts, np.float32)
  if acts.ndim != 2 or acts.shape[1] != config.d_model:
    raise ValueError(f"activations shape {acts.shape} must be (n, d_model={config.d_model})")
  if len(acts) < batch_tokens:
    raise ValueError(f"{len(acts)} activations are fewer than batch_tokens={batch_tokens}")
  rng = np.random.default_rng(seed)
  params = init(seed, config, acts[rng.permutation(len(acts))[:32768]])
  scale = jnp.float32(mse_scale(acts[rng.permutation(len(acts))[:32768]]))
  place = lambda x: x
  if mesh is not None:
    from bertjax import mesh as mesh_lib

    axes = mesh_lib.row_axes(mesh, interventions=True)
    if batch_tokens % mesh_lib.size_of(mesh, axes):
      raise ValueError(
        f"batch_tokens={batch_tokens} must divide over the mesh's "
        f"{mesh_lib.size_of(mesh, axes)} row devices"
      )
    params = mesh_lib.shard_params(params, mesh)
    place = lambda x: mesh_lib.shard_rows(x, mesh, axes)
  state = start(params, config)
  step = make_step(config)
  order, cursor, log = rng.permutation(len(acts)), 0, []
  for i in timing.steps(steps, "sae", show=progress, leave=False):
    if cursor + batch_tokens > len(order):
      order, cursor = rng.permutation(len(acts)), 0
    x = place(acts[order[cursor : cursor + batch_tokens]])
    cursor += batch_tokens
    state, metrics = step(state, x, scale)
    if (log_every and i % log_every == 0) or i == steps - 1:
      log.append((i, {k: float(v) for k, v in metrics.items()}))
  return state, log


def evaluate(
  params: Params,
  config: SAEConfig,
  acts,
  *,
  dense_above: float = 0.1,
  chunk: int = 8192,
  groups=None,
) -> dict[str, Any]:
  """How well the SAE explains held-out activations `acts` (n, d).

  Args:
    groups: optional `(n,)` group of each token (its passage, 0..G-1): the sums of the FVU
      are kept per group too, the items of an interval over the groups (a passage's tokens
      are not independent).

  Returns:
    "fvu": sum |x - x_hat|^2 / sum |x - mean x|^2 (fraction of variance unexplained);
    "l0": mean active latents per token; "frequency" (latents,): the share of tokens each
    fires on; "dead": the share of latents firing on none; "dense": the share firing on
    more than `dense_above` of the tokens; with `groups`, "per_group": {"error", "variance"},
    `(G,)` each, the FVU's numerator and denominator summed per group (their sums' ratio is
    the FVU).
  """
  acts = np.asarray(acts, np.float32)
  run = jax.jit(encode, static_argnums=2)
  token_err = np.zeros(len(acts))
  counts = np.zeros(config.latents, np.int64)
  l0 = 0
  for i in range(0, len(acts), chunk):
    x = acts[i : i + chunk]
    values, indices = run(params, x, config.k)
    recon = np.asarray(decode(params, values, indices), np.float64)
    token_err[i : i + len(x)] = np.sum((recon - x) ** 2, -1)
    on = np.asarray(values) > 0
    np.add.at(counts, np.asarray(indices)[on], 1)
    l0 += int(on.sum())
  token_var = np.sum((acts.astype(np.float64) - acts.mean(0, dtype=np.float64)) ** 2, -1)
  err, var = float(np.sum(token_err)), float(np.sum(token_var))
  freq = counts / max(len(acts), 1)
  out = {}
  if groups is not None:
    groups = np.asarray(groups)
    if groups.shape != (len(acts),):
      raise ValueError(f"groups shape {groups.shape} must be ({len(acts)},), one per token")
    out["per_group"] = {
      "error": np.bincount(groups, token_err),
      "variance": np.bincount(groups, token_var),
    }
  return {
    **out,
    "fvu": err / var,
    "l0": l0 / max(len(acts), 1),
    "frequency": freq,
    "dead": float(np.mean(counts == 0)),
    "dense": float(np.mean(freq > dense_above)),
    "tokens": len(acts),
  }


def scaling_sweep(
  train_acts,
  held_acts,
  expansions,
  *,
  k: int,
  lr: float,
  steps: int,
  batch_tokens: int,
  seed: int = 0,
  log: Callable[[str], None] | None = None,
  groups=None,
) -> tuple[dict[str, Any], tuple[TrainState, SAEConfig, dict[str, Any]]]:
  """One top-k SAE per expansion e (e x d latents, k kept, at most all), trained on
  `train_acts` (`train`) and evaluated on `held_acts` (`evaluate`), with the power law
  FVU = a * latents^b fitted over the sizes (`stats.power_law_fit`). A latent is dead after
  100 steps without firing (the released 10M tokens are 76 of its 131k-token steps).

  Returns:
    `(r, last)`: `r` holds, per size in order, "latents", "fvu", "dead", "dense", "l0" and
    "train_log", with "fit", "train_tokens" and "held_out_tokens" (and with `groups`, the
    held-out tokens' passages as `evaluate` takes them, "per_group": "error" per size and
    group, "variance" per group); `last` is the largest SAE's (state, config, evaluation).
  """
  from bertjax import stats

  d = np.shape(train_acts)[1]
  keys = ("fvu", "dead", "dense", "l0")
  r: dict[str, Any] = {"latents": [], **{key: [] for key in keys}, "train_log": []}
  r.update(held_out_tokens=len(held_acts), train_tokens=len(train_acts))
  last = None
  for e in expansions:
    cfg = SAEConfig(
      d_model=d, latents=e * d, k=min(k, e * d), lr=lr, dead_tokens=100 * batch_tokens
    )
    state, train_log = train(
      train_acts,
      cfg,
      steps=steps,
      batch_tokens=batch_tokens,
      seed=seed,
      progress=False,
      log_every=max(steps // 10, 1),
    )
    ev = evaluate(state.params, cfg, held_acts, groups=groups)
    if log is not None:
      log(f"{e * d} latents: FVU {ev['fvu']:.4f}, dead {ev['dead']:.3f}, dense {ev['dense']:.3f}")
    for key in keys:
      r[key].append(ev[key])
    r["latents"].append(e * d)
    r["train_log"].append(train_log)
    if groups is not None:
      per = r.setdefault("per_group", {"error": [], "variance": ev["per_group"]["variance"]})
      per["error"].append(ev["per_group"]["error"])
    last = (state, cfg, ev)
  r["fit"] = stats.power_law_fit(r["latents"], r["fvu"])
  return r, last


def _edit(sae: Params, k: int, zero: bool):
  """A site's value (any leading axes, one token's vector flattened last) replaced by its
  reconstruction, or by zeros."""

  def edit(value):
    if zero:
      return jnp.zeros_like(value)
    flat = value.reshape(-1, sae["W_enc"].shape[0]).astype(jnp.float32)
    return reconstruct(sae, flat, k).reshape(value.shape).astype(value.dtype)

  return edit


def _at_layer(edit, layer: int):
  """A function patch applying `edit` in block `layer` only (one branch runs per block)."""
  return lambda value, block: jax.lax.cond(jnp.asarray(block) == layer, edit, lambda v: v, value)


def loss_recovered(
  params: Params,
  config: BertConfig,
  batches: Iterable,
  site: str,
  layer: int | None,
  sae: Params,
  sae_config: SAEConfig,
  loss_fn: Callable[[Any, dict], jax.Array],
) -> dict[str, float]:
  """The model's loss with the site replaced by the SAE's reconstruction at `layer`.

  Args:
    loss_fn: `loss_fn(out, batch) -> scalar` from `bertjax.forward`'s output and the batch
      (as a dict), e.g. an MLM loss or a probe's cross-entropy; averaged over batches.

  Returns:
    "clean", "sae", "zero" (the site zero-ablated at that layer) losses and "recovered",
    `(zero - sae) / (zero - clean)`: 1 when the reconstruction costs nothing, 0 when it is
    as bad as removing the site.
  """
  _check_site(config, site, layer)
  edits = {"sae": _edit(sae, sae_config.k, False), "zero": _edit(sae, sae_config.k, True)}
  fns = {name: _at_layer(edit, layer) for name, edit in edits.items() if site != "embeddings"}
  totals = {"clean": 0.0, "sae": 0.0, "zero": 0.0}
  n = 0
  for batch in batches:
    b = as_batch(batch)
    args = (params, config, b["input_ids"], b["attention_mask"], b["token_type_ids"])
    totals["clean"] += float(loss_fn(forward(*args), b))
    for name, edit in edits.items():
      if site == "embeddings":  # the embedding output: edited, then run through every block
        value = forward(*args, capture=("embeddings",)).cache["embeddings"]
        out = forward(*args, patch={"embeddings": (edit(value), 1.0)})
      else:
        out = forward(*args, patch={site: fns[name]})
      totals[name] += float(loss_fn(out, b))
    n += 1
  if n == 0:
    raise ValueError("loss_recovered needs at least one batch")
  means = {k: v / n for k, v in totals.items()}
  gap = means["zero"] - means["clean"]
  means["recovered"] = (means["zero"] - means["sae"]) / gap if gap else float("nan")
  return means


def top_activating(
  params: Params,
  config: BertConfig,
  tok,
  batches: Iterable,
  site: str,
  layer: int | None,
  sae: Params,
  sae_config: SAEConfig,
  latents,
  *,
  n: int = 8,
  context: int = 4,
) -> dict[int, list[dict]]:
  """Each of `latents`' `n` strongest activations over `batches`, with the token and
  `context` tokens either side: {latent: [{"value", "token", "text", "batch", "row",
  "position"}, ...]} strongest first."""
  latents = [int(i) for i in latents]
  best: dict[int, list[tuple[float, int, int, int]]] = {i: [] for i in latents}
  kept = np.asarray(latents)
  encoded, cached = (
    jax.jit(lambda x: dense_latents(*encode(sae, x, sae_config.k), sae_config.latents)[:, kept]),
    [],
  )
  for bi, batch in enumerate(batches):
    b = as_batch(batch)
    flat, ids, real = _site_rows(params, config, b, site, layer)
    rows, pos = np.nonzero(real)
    z = np.asarray(encoded(flat))  # (tokens, len(latents))
    cached.append((ids, real.sum(1)))
    for j, latent in enumerate(latents):
      top = np.argsort(-z[:, j])[:n]
      best[latent] += [(float(z[t, j]), bi, int(rows[t]), int(pos[t])) for t in top if z[t, j] > 0]
  out = {}
  for latent, items in best.items():
    items = sorted(items, key=lambda t: -t[0])[:n]
    out[latent] = [
      {
        "value": v,
        "batch": bi,
        "row": r,
        "position": p,
        "token": tok.convert_ids_to_tokens([int(cached[bi][0][r, p])])[0],
        "text": tok.decode(
          cached[bi][0][
            r, max(0, p - context) : min(p + context + 1, int(cached[bi][1][r]))
          ].tolist()
        ),
      }
      for v, bi, r, p in items
    ]
  return out

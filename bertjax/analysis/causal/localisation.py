"""Causal-variable localisation, MIB's second track: which method's intervention at which
layer carries the variable, scored pair by pair.

For every layer, each held-out pair's interchange is right or wrong (its intervened prediction
is the counterfactual label or not); the interchange-intervention accuracy (IIA) is the mean.
`correctness` gives these per method, as MIB compares them (Mueller et al. 2025):

* "full": the whole vector at the pairs' positions (every coordinate interchanged);
* "das": a learned k-dimensional rotation (`interchange.layer_search(method="das")`);
* "dbm": a learned mask over the neurons (`layer_search(method="dbm")` on the standard basis);
* "pca": the top k principal directions of the training pairs' activations;
* "sae": a learned mask over a top-k SAE's latents at each layer
  (`sae_features.train_sae_mask`), with SAEs from `layer_saes` or the caller's own.

The per-pair values are what an interval resamples (`bertjax.claims`, unit "pairs").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bertjax.analysis.causal import interchange as ci
from bertjax.analysis.causal import sae_features
from bertjax.model.config import BertConfig

Params = ci.Params
METHODS = ("full", "das", "dbm", "pca", "sae")


def layer_saes(
  params: Params,
  config: BertConfig,
  batches: Sequence,
  site: str,
  *,
  expansion: int = 8,
  k: int = 32,
  steps: int = 300,
  batch_tokens: int = 1024,
  lr: float = 1e-3,
  max_tokens: int | None = 65536,
  seed: int = 0,
) -> list[Params]:
  """A top-k SAE of `expansion` x the site's width per layer, each trained on the site's
  activations over `batches` (real tokens, at most `max_tokens`), for `correctness(...,
  saes=)`. `steps` Adam steps of `batch_tokens` rows at `lr` (AuxK on; `sae.train`)."""
  from bertjax.analysis.representations import sae as sae_lib

  if expansion < 1:
    raise ValueError(f"expansion={expansion} must be >= 1")
  width = sae_lib.site_width(config, site)
  by_layer = sae_lib.activations_by_layer(
    params, config, batches, site, range(config.depth), max_tokens=max_tokens
  )
  out = []
  for acts in by_layer:
    cfg = sae_lib.SAEConfig(d_model=width, latents=expansion * width, k=k, lr=lr)
    state, _ = sae_lib.train(
      acts, cfg, steps=steps, batch_tokens=min(batch_tokens, len(acts)), seed=seed, progress=False
    )
    out.append(state.params)
  return out


def correctness(
  params: Params,
  config: BertConfig,
  train: ci.CounterfactualPairs,
  held: ci.CounterfactualPairs,
  site: str,
  *,
  methods: Sequence[str] = METHODS,
  k: int = 1,
  steps: int = 100,
  seed: int = 0,
  saes: Sequence[Params] | None = None,
  sae_k: int = 32,
) -> dict[str, np.ndarray]:
  """Per method, (layers, held-out pairs) int8: 1 where the pair's interchange at that layer
  gives its counterfactual label. DAS and PCA use `k` dimensions; DAS, DBM and the SAE mask
  train for `steps` full-batch Adam steps on `train`. "sae" needs `saes`, one top-k SAE per
  layer (`layer_saes`) keeping `sae_k` latents."""
  unknown = sorted(set(methods) - set(METHODS))
  if unknown:
    raise ValueError(f"methods {unknown} are not among {METHODS}")
  if "sae" in methods and (saes is None or len(saes) != config.depth):
    got = "none" if saes is None else len(saes)
    raise ValueError(f'"sae" needs one SAE per layer ({config.depth}); got {got}')
  dim, seq = config.hidden_size, held.base_ids.shape[1]
  right = lambda logits: np.argmax(np.asarray(logits), -1) == np.asarray(held.label)

  def interchanged(layer, basis, weights=1.0):
    w = ci.position_weight(config, site, layer, held.positions, seq, len(basis)) * weights
    return right(ci.interchange_logits(params, config, held, site, basis, w))

  layers = range(config.depth)
  out = {}
  for method in methods:
    if method == "full":
      out[method] = [interchanged(i, np.eye(dim, dtype=np.float32)) for i in layers]
    elif method == "pca":
      out[method] = [
        interchanged(i, ci.pca_basis(params, config, train, site, i, k)) for i in layers
      ]
    elif method in ("das", "dbm"):
      kw = {"k": k} if method == "das" else {"basis": np.eye(dim, dtype=np.float32)}
      fits = ci.layer_search(
        params, config, train, held, site, method=method, steps=steps, seed=seed, **kw
      )
      out[method] = [interchanged(f.layer, f.basis, f.mask) for f in fits]
    else:  # "sae"
      out[method] = []
      for i in layers:
        fit = sae_features.train_sae_mask(
          params, config, train, site, i, saes[i], sae_k, steps=steps
        )
        logits = sae_features.sae_interchange_logits(
          params, config, held, site, i, saes[i], sae_k, fit.mask
        )
        out[method].append(right(logits))
  return {m: np.asarray(out[m], np.int8) for m in methods}

"""The closed form of every edge's EAP score on post-LN blocks (`edges.edge_attribution`).

With each LayerNorm's `1 / sigma` frozen at the patched run, the difference a sender's
output makes at a receiver's input is the difference carried through the LayerNorms
between them: per token, `Lambda_t / Lambda_a` times it minus the chain's running means,
where `Lambda_k = (prod_{j<k} g_j) (prod_{j<k} 1 / sigma_j)` splits into a per-dimension
and a per-token factor (`scaled_chain`). So every sender's difference is scaled once, every
receiver's gradient once, and the scores are two matrix products over the tokens: the
difference . gradient term, summed chunk by chunk (`token_products`), and a K-dimensional
correction for the means, K = 2 x depth. `bertjax.analysis.interventions.edges`' docstring
derives the edges."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def scaled_chain(config, gammas, sigma):
  """The per-dimension and per-token factors of Lambda_k = G_k S_k, k = 0 .. K, each
  normalised about its geometric midpoint (the ratios the scores use are unchanged):
  `(G, Ginv, S, Sinv)`, (K+1, H) and (K+1, B, T)."""
  log_g = jnp.concatenate([jnp.zeros_like(gammas[:1]), jnp.cumsum(jnp.log(jnp.abs(gammas)), 0)])
  sign = jnp.concatenate([jnp.ones_like(gammas[:1]), jnp.cumprod(jnp.sign(gammas), 0)])
  log_g = log_g - (log_g.max(0) + log_g.min(0)) / 2
  log_s = jnp.concatenate([jnp.zeros_like(sigma[:1]), -jnp.cumsum(jnp.log(sigma), 0)])
  log_s = log_s - (log_s.max(0) + log_s.min(0)) / 2
  return sign * jnp.exp(log_g), sign * jnp.exp(-log_g), jnp.exp(log_s), jnp.exp(-log_s)


def token_chunk(tokens: int, width: int, target: int = 16384) -> int:
  """The largest divisor c of `tokens` whose chunk of `c x width` values is at most `target`
  (1 if none is)."""
  best = 1
  for c in range(1, tokens + 1):
    if tokens % c == 0 and c * width <= target:
      best = c
  return best


def token_products(x, dim_scale, token_scale, ys):
  """`[einsum("sth,sh,st,rth->sr", x, dim_scale, token_scale, y) for y in ys]` for x (S,
  tokens, H) and each y (R, tokens, H), summed over chunks of tokens, so the scaled x is
  never written whole and each matrix product is a chunk's: XLA's CPU product runs so long
  a contraction slowly in one piece (BERT-base 8 x 128, 157 x 432 over 786,432 values, AMD
  EPYC: 0.96-2.2 s in one product, 0.70-1.6 s in chunks of 16 tokens, side by side)."""
  tokens, width = x.shape[1], x.shape[2]
  c = token_chunk(tokens, width)
  part = lambda a, i: jax.lax.dynamic_slice_in_dim(a, i * c, c, 1)

  def body(i, acc):
    a = part(x, i) * dim_scale[:, None, :] * part(token_scale, i)[..., None]
    a = a.reshape(a.shape[0], -1)
    return tuple(s + a @ part(y, i).reshape(y.shape[0], -1).T for s, y in zip(acc, ys))

  zeros = tuple(jnp.zeros((x.shape[0], y.shape[0]), jnp.result_type(x, y)) for y in ys)
  return jax.lax.fori_loop(0, tokens // c, body, zeros)


def score_matrix(config, g, w, deltas, sigma, grads):
  """(n_senders, n_receivers) EAP scores from the sender differences, the sigmas of the run
  the edges are patched in and the receivers' input gradients (the closed form above)."""
  depth, n = config.depth, config.num_attention_heads
  k_ln = 2 * depth
  G, Ginv, S, Sinv = scaled_chain(config, w["gammas"], sigma)
  stage = np.asarray(g.sender_stage)
  # Senders' differences divided by Lambda at the stage where they enter, z = deltas Ginv Sinv
  # (per dimension and per token; `token_products` applies them chunk by chunk).
  z_dim, z_token = Ginv[stage], Sinv[stage]  # (n_s, H), (n_s, B, T)
  # The running means of each sender's carried difference: mu (I + Gamma) = P.
  p_w = z_dim[:, :, None] * G[:k_ln].T[None] / G.shape[1]  # (n_s, H, K)
  p = jnp.einsum("sbth,shk->sbtk", deltas, p_w) * z_token[..., None]
  p = p * (np.arange(k_ln)[None, :] >= stage[:, None])[:, None, None, :]
  gamma = jnp.triu(Ginv[:k_ln] @ G[:k_ln].T / G.shape[1], 1)  # (j, k): mean(G_k / G_j), j < k
  a = jnp.eye(k_ln) + gamma
  flat = p.reshape(-1, k_ln)
  mu = jax.scipy.linalg.solve_triangular(a.T, flat.T, lower=True).T.reshape(p.shape)
  flat_mu = mu.reshape(mu.shape[0], -1)
  before = lambda stages: (np.arange(k_ln) < stages[:, None])[:, None, None, :]

  # The heads' query, key and value inputs, (L, 3, N) receivers: each one's Lambda is folded
  # into its projection (per dimension) and its gradient (per token) before the projection.
  t_heads = 2 * np.arange(depth)
  w_qkv = jnp.stack([w[s] for s in "qkv"], 1) * G[t_heads][:, None, :, None, None]
  g_qkv = jnp.stack([jnp.stack(grads[s]) for s in "qkv"], 1)  # (L, 3, B, T, N, d)
  g_qkv = g_qkv * S[t_heads][:, None, :, :, None, None].astype(g_qkv.dtype)
  gh = jnp.einsum("lsbtnd,lshnd->lsnbth", g_qkv, w_qkv)
  gh = gh.reshape((-1,) + gh.shape[3:])  # (L 3 N, B, T, H)
  # Their means' terms come from the head-sized gradients: Ginv . (W g) = (W^T Ginv) . g.
  w_nu = jnp.einsum("lshnd,kh->lsndk", w_qkv, Ginv[:k_ln])
  nu_heads = jnp.einsum("lsbtnd,lsndk->lsnbtk", g_qkv, w_nu)
  nu_heads = nu_heads.reshape((-1,) + nu_heads.shape[3:]) * before(np.repeat(t_heads, 3 * n))
  # The FFNs' inputs and the final state.
  t_rest = np.append(t_heads + 1, k_ln)
  rest = jnp.concatenate([jnp.stack(grads["ffn_in"]), grads["out"][None]])
  rest = rest * G[t_rest][:, None, None, :] * S[t_rest][..., None]
  nu_rest = jnp.einsum("rbth,kh->rbtk", rest, Ginv[:k_ln]) * before(t_rest)

  # One product over every sender: the pairs off the graph are computed too and zeroed
  # below, which is faster than a product per receiver stage on its senders alone.
  tokens = lambda x: x.reshape(x.shape[0], -1, x.shape[-1])
  heads, others = token_products(
    tokens(deltas), z_dim, z_token.reshape(z_token.shape[0], -1), (tokens(gh), tokens(rest))
  )
  heads = heads - flat_mu @ nu_heads.reshape(nu_heads.shape[0], -1).T
  others = others - flat_mu @ nu_rest.reshape(nu_rest.shape[0], -1).T
  # The columns in receiver order: per layer its 3N head inputs and its FFN, the logits last.
  per_layer = jnp.concatenate([heads.reshape(-1, depth, 3 * n), others[:, :depth, None]], 2)
  out = jnp.concatenate([per_layer.reshape(per_layer.shape[0], -1), others[:, depth:]], 1)
  return jnp.where(g.valid, out, 0.0)

"""`kernels.attention`: one attention function, several implementations; the dispatch.

The padding is described once, by a `kernels.Mask` (`kv_lengths`, `segment_ids`,
`key_mask`, and a sliding `window`; `kernels.masks`), given as `mask=` or as those keywords;
this module hands each implementation the mask in the form it takes, so callers never choose
between a key mask and lengths. A position bias (`kernels.PositionBias`: MPNet's relative
buckets, ALiBi) is given as `bias=`; keys and values may have fewer heads than the queries
(grouped key/value heads, a divisor of the query heads), and are never repeated. The entry points: `attention` (the output), `attention_with_stats` (the output
and per-head statistics of the attention) and `attention_probs` (the maps, for callers that
read or edit them before mixing the values).

* `impl="xla"`: plain XLA ops, float32 (float64 when the inputs are float64). With
  `return_probs=True`, the pure-jnp reference (`kernels.reference`, the only implementation
  that returns the probabilities); otherwise `kernels.xla_attention`, the same function with a
  flash-style hand-written backward (about half the `T x T` memory passes of autodiff), or,
  for a window layer whose band is narrower than half the sequence, `kernels.xla_banded`
  (the band alone, in query blocks: cost T x window).
* `impl="pallas"`: the fused kernels: `kernels.flash_attention` (Triton-style; compiled on
  GPU) or `kernels.flash_attention_tpu` (Mosaic layout; compiled on TPU), chosen by
  `kernel_variant` (None: by backend); either runs anywhere in interpret mode. Padding is
  right padding given by `kv_lengths`; an arbitrary `key_mask` is converted with
  `kv_lengths = key_mask.sum(-1)`, i.e. pallas ASSUMES a right-padding mask (this cannot be
  checked under jit; use `impl="xla"` for any other mask).
* `impl="cudnn"`: `jax.nn.dot_product_attention(..., implementation="cudnn")`, GPU only, for
  comparison ("scale" head masks only, applied to the output; no segment ids).
* `impl="auto"`: pallas on GPU and TPU unless probabilities are requested; xla on CPU (and
  for `attention_with_stats` on TPU, which has no TPU statistics kernel yet).

Note: the package attribute `kernels.attention` is this function, which shadows this module;
import names from it with `from bertjax.kernels.attention import ...`.

Query rows that are padding (index >= kv_length, or key_mask False) produce zeros in every
implementation, so outputs and gradients are finite and comparable across implementations.

Attention dropout (`dropout_rate`, `dropout_seed`) is implemented by "xla" (both paths, and
`reference_attention`) and "pallas" (both variants, forward and backward, compiled and
interpreted), all drawing the same mask from `kernels.dropout`; "cudnn" and
`attention_with_stats` refuse it with an error.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from . import dropout as drop
from . import flash_attention as fa
from . import flash_attention_stats as fa_stats
from . import flash_attention_tpu as fa_tpu
from .disentangled import BIASES, DisentangledBias
from .masks import Mask, mask_of
from .position_bias import PositionBias
from .reference import (
  ABLATIONS,
  Ablation,
  reference_attention,
  reference_statistics,
  validate_dropout,
)
from .tiling import BlockSizes
from .xla_attention import attention_probs as _xla_probs
from .xla_attention import xla_attention
from .xla_banded import band_width, banded_attention

# The implementations of `attention` (`config.attention_impl` takes the same names).
IMPLS = ("auto", "xla", "pallas", "cudnn")
# The Pallas kernel families of `impl="pallas"`.
KERNEL_VARIANTS = ("triton", "tpu")


def _validate(q, k, v, mask: Mask, head_mask, ablation, impl, special_mask=None, bias=None):
  """Checks shapes and options before any compute; returns head_mask as (batch, heads)."""
  if impl not in IMPLS:
    raise ValueError(f"{impl=} must be one of {IMPLS}")
  if ablation not in ABLATIONS:
    raise ValueError(f"{ablation=} must be one of {ABLATIONS}")
  if q.ndim != 4:
    raise ValueError(f"{q.shape=} must be (batch, seq, heads, head_dim)")
  batch, seq, heads, head_dim = q.shape
  if (
    k.ndim != 4
    or k.shape != v.shape
    or k.shape[0] != batch
    or k.shape[3] != head_dim
    or heads % k.shape[2]
  ):
    raise ValueError(
      f"{k.shape=} and {v.shape=} must be (batch, seq_k, kv_heads, head_dim) matching "
      f"{q.shape=}, with kv_heads dividing the query heads"
    )
  if bias is not None:
    if not isinstance(bias, BIASES):
      raise TypeError(
        f"bias={type(bias).__name__} must be a kernels.PositionBias or kernels.DisentangledBias"
      )
    if isinstance(bias, DisentangledBias):
      bias.validate(heads, head_dim)
      if k.shape[2] != heads:
        raise ValueError(
          f"a DisentangledBias needs one key head per query head, got {k.shape[2]} for {heads}"
        )
      if mask.window is not None:
        raise ValueError(
          f"a DisentangledBias with a sliding window (window={mask.window}) is not supported"
        )
    else:
      bias.validate(heads)
  for name, value in (("q", q), ("k", k), ("v", v)):
    if not jnp.issubdtype(value.dtype, jnp.floating):
      raise ValueError(f"{name}.dtype={value.dtype} must be floating")
  mask.validate(batch, seq, k.shape[1])
  if special_mask is not None and jnp.shape(special_mask) != (batch, k.shape[1]):
    raise ValueError(
      f"special_mask.shape={jnp.shape(special_mask)} must be ({batch}, {k.shape[1]})"
    )
  if head_mask is None:
    return None
  head_mask = jnp.asarray(head_mask)
  if not jnp.issubdtype(head_mask.dtype, jnp.floating):
    raise ValueError(f"head_mask.dtype={head_mask.dtype} must be floating")
  if head_mask.shape == (heads,):
    return jnp.broadcast_to(head_mask[None, :], (batch, heads))
  if head_mask.shape == (batch, heads):
    return head_mask
  raise ValueError(f"head_mask.shape={head_mask.shape} must be ({heads},) or ({batch}, {heads})")


def attention_impl(impl: str = "auto") -> str:
  """The implementation `attention(..., impl=impl)` runs on this backend (no maps asked)."""
  if impl not in IMPLS:
    raise ValueError(f"{impl=} must be one of {IMPLS}")
  return _resolve_impl(impl, False)


def _resolve_impl(impl, return_probs, stats=False):
  if impl != "auto":
    return impl
  if return_probs:
    return "xla"
  backend = jax.default_backend()
  return "pallas" if backend == "gpu" or (backend == "tpu" and not stats) else "xla"


def _pallas_variant(interpret, variant, stats=False):
  """(interpret, variant): None picks by backend; interpret=None means True on CPU."""
  backend = jax.default_backend()
  interpret = backend == "cpu" if interpret is None else interpret
  if variant is None:
    variant = "tpu" if backend == "tpu" else "triton"
  if variant not in KERNEL_VARIANTS:
    raise ValueError(f"{variant=} must be one of {KERNEL_VARIANTS} or None")
  if not interpret and (backend, variant) not in (("gpu", "triton"), ("tpu", "tpu")):
    raise ValueError(f"compiled pallas {variant=} cannot run on backend={backend!r}")
  if stats and variant == "tpu":
    raise NotImplementedError(
      "attention_with_stats has no TPU pallas kernel yet: use impl='xla' (or 'auto' on TPU)"
    )
  return interpret, variant


def _fused_mask(q, k, mask: Mask) -> Mask:
  """The mask as the fused kernels (pallas, cudnn) take it: lengths, assuming right padding."""
  if k.shape[1] != q.shape[1]:
    raise ValueError(f"impl='pallas' needs equal q and k lengths, got {q.shape[1]=}, {k.shape[1]=}")
  return mask.as_lengths()


def attention(
  q,
  k,
  v,
  *,
  mask: Mask | None = None,
  kv_lengths=None,
  segment_ids=None,
  key_mask=None,
  head_mask=None,
  ablation: Ablation = "scale",
  scale=None,
  return_probs=False,
  impl="auto",
  interpret=None,
  block_sizes: BlockSizes | None = None,
  backward="pallas",
  kernel_variant=None,
  dropout_rate=0.0,
  dropout_seed=None,
  bias: PositionBias | None = None,
):
  """Multi-head attention on `(batch, seq, heads, head_dim)` inputs.

  The padding is given once, as `mask=Mask(...)` or as its parts' keywords (`kv_lengths=`,
  `segment_ids=`, `key_mask=`), and each implementation takes it in its own form: xla uses
  every part as it is; pallas and cudnn fold a key mask into lengths (right padding).

  Args:
    q: queries `(batch, seq_q, heads, head_dim)`.
    k: keys `(batch, seq_k, kv_heads, head_dim)` (seq_k == seq_q for pallas); kv_heads
      divides heads (grouped key/value heads: query head h reads group h // (heads /
      kv_heads), as transformers' `repeat_kv`).
    v: values, shaped like k.
    mask: a `kernels.Mask` of the three parts below; give either it or the keywords.
    kv_lengths: int `(batch,)`: keys at index >= kv_lengths[b] are right padding.
    segment_ids: int `(batch, seq)`: packed sequences; queries see keys of their segment.
    key_mask: bool `(batch, seq_k)`, True = real key. Any mask with xla; pallas assumes it is
      a right-padding mask and uses `key_mask.sum(-1)` as lengths.
    head_mask: float `(heads,)` or `(batch, heads)`: xi per head, differentiable.
    ablation: "scale" (out = xi * A V) or "uniform" (A -> xi A + (1 - xi) U).
    scale: logit scale; None means `1 / sqrt(head_dim)`.
    return_probs: with impl "xla" (or "auto"), also return the attention used,
      `(batch, heads, seq_q, seq_k)` (xi * A in scale mode, the mixture in uniform mode).
    impl: "auto", "xla", "pallas" or "cudnn" (`IMPLS`).
    interpret: Pallas interpret mode; None means True when the default backend is CPU.
    block_sizes: `BlockSizes` for pallas; None means the backend default.
    backward: pallas gradient: "pallas" (fused kernels) or "reference" (vjp of xla; Triton
      variant only).
    kernel_variant: pallas kernels: "triton", "tpu", or None (by backend).
    dropout_rate: attention dropout (a static Python float in [0, 1)): inverted dropout on
      the attention that mixes the values, as `nn.Dropout` on BERT's probabilities: each
      entry is kept with probability `1 - rate` and scaled by `1 / (1 - rate)`; the output
      is `dropped(P) @ V`. "scale" mode: `xi * dropped(A) @ V` (the head mask after dropout,
      as in Hugging Face). "uniform" mode: dropout applies AFTER the mix,
      `dropped(xi A + (1 - xi) U) @ V`, one mask for both parts. The softmax normaliser is
      the undropped one. 0 (the default) is exactly the no-dropout computation. Supported
      by impl "xla" (with and without return_probs, which then returns the dropped
      attention) and "pallas" (both variants and both backwards); "cudnn" raises.
    dropout_seed: required when dropout_rate > 0: an int32 or uint32 scalar array
      (traceable), e.g. `jax.random.bits(jax.random.fold_in(key, layer), (), jnp.uint32)`,
      or a single typed PRNG key (`jax.random.key`), turned into such a seed. The mask is a
      hash of (seed, batch index, head, query index, key index) (`kernels.dropout`): every
      implementation draws the same mask for the same seed, and no mask is stored between
      the forward and backward passes. Use a fresh seed per layer and step; under
      `shard_map` fold the shard index into the key (batch indices are shard-local).

  Returns:
    `(batch, seq_q, heads, head_dim)` in q's dtype, or `(out, probs)` with return_probs.
    Padded query rows are zero.
  """
  mask = mask_of(mask, kv_lengths, segment_ids, key_mask)
  head_mask = _validate(q, k, v, mask, head_mask, ablation, impl)
  dropout_rate, dropout_seed = validate_dropout(dropout_rate, dropout_seed)
  impl = _resolve_impl(impl, return_probs)
  _check_combination(impl, dropout_rate, return_probs, backward)
  if impl == "xla":
    return _xla(
      q, k, v, mask, head_mask, ablation, scale, return_probs, dropout_rate, dropout_seed, bias
    )
  if impl == "cudnn":
    _check_fused_variants(impl, q, k, mask, bias)
    return _cudnn_attention(q, k, v, mask, head_mask, ablation, scale)
  interpret, variant = _pallas_variant(interpret, kernel_variant)
  _check_fused_variants(impl, q, k, mask, bias, variant)
  kwargs = {
    "mask": _fused_mask(q, k, mask),
    "head_mask": head_mask,
    "ablation": ablation,
    "scale": scale,
    "block_sizes": block_sizes,
    "interpret": interpret,
    "dropout_rate": dropout_rate,
    "dropout_seed": dropout_seed,
  }
  if variant == "tpu":
    if backward != "pallas":
      raise ValueError(f"{backward=} is not available for the TPU kernels, only 'pallas'")
    return fa_tpu.flash_attention_tpu(q, k, v, **kwargs)
  return fa.flash_attention(q, k, v, backward=backward, bias=bias, **kwargs)


def _xla(q, k, v, mask, head_mask, ablation, scale, return_probs, dropout_rate, dropout_seed, bias):
  """`impl="xla"`: the reference when the maps are returned; a window layer whose band is
  narrower than half the sequence on its band alone; otherwise the custom-backward path."""
  kw = dict(
    head_mask=head_mask,
    ablation=ablation,
    scale=scale,
    dropout_rate=dropout_rate,
    dropout_seed=dropout_seed,
    bias=bias,
  )
  if return_probs:
    return reference_attention(q, k, v, mask=mask, return_probs=True, **kw)
  if mask.window is not None and q.shape[1] >= 2 * band_width(mask.window):
    return banded_attention(q, k, v, mask=mask, **kw)
  allowed, row_real = mask.allowed(q.shape[0], q.shape[1], k.shape[1], per_query=False)
  return xla_attention(q, k, v, allowed=allowed, row_real=row_real, **kw)


def _check_fused_variants(impl, q, k, mask: Mask, bias, variant=None):
  """Rejects what the fused implementations do not compute (never a silent fallback): cuDNN
  and the TPU kernels have no window, position bias or grouped heads; the Triton-layout
  Pallas kernels have all three."""
  if isinstance(bias, DisentangledBias) and impl == "cudnn":
    raise ValueError(
      "impl='cudnn' does not support DeBERTa's disentangled position terms (c2p/p2c); use "
      "impl='xla', or impl='pallas' with the Triton-layout kernels"
    )
  if impl == "pallas" and variant == "triton":
    return
  missing = []
  if mask.window is not None:
    missing.append(f"a sliding window (window={mask.window})")
  if bias is not None:
    missing.append(f"a position bias ({bias.kind})")
  if k.shape[2] != q.shape[2]:
    missing.append(f"grouped key/value heads ({k.shape[2]} for {q.shape[2]} query heads)")
  if missing:
    where = f"impl={impl!r}" + (f" with kernel_variant={variant!r}" if variant else "")
    raise ValueError(
      f"{where} does not support {', '.join(missing)}; use impl='xla', or impl='pallas' with "
      "the Triton-layout kernels (kernel_variant='triton')"
    )


def _check_combination(impl, dropout_rate, return_probs, backward):
  """Rejects the option combinations `attention`'s resolved `impl` cannot honour."""
  if impl == "cudnn" and dropout_rate > 0:
    raise ValueError(
      f"impl='cudnn' with dropout_rate={dropout_rate} is not supported (cuDNN's dropout "
      "mask is not the kernels.dropout hash); use impl='pallas' or 'xla'"
    )
  if return_probs and impl != "xla":
    raise ValueError(f"return_probs=True needs impl='xla' (or 'auto'), got {impl=}")
  if backward not in ("pallas", "reference"):
    raise ValueError(f"{backward=} must be 'pallas' or 'reference'")


def attention_probs(
  q, k, *, mask: Mask | None = None, kv_lengths=None, key_mask=None, scale=None, bias=None
):
  """Attention probabilities `(batch, heads, seq_q, seq_k)` in float32, fast on every backend.

  The maps `reference_attention(..., return_probs=True)` gives (no head mask;
  padded query rows zero), through `kernels.xla_attention`'s heads-first,
  additive-bias formulation. Differentiable. The mask as in `attention` (every part,
  segment ids and the window too, as the xla implementation takes it); `bias` a
  `PositionBias` or None; k may have grouped heads.
  """
  mask = mask_of(mask, kv_lengths, None, key_mask)
  if isinstance(bias, DisentangledBias):
    bias.validate(q.shape[2], q.shape[3])
  elif bias is not None:
    bias.validate(q.shape[2])
  allowed, row_real = mask.allowed(q.shape[0], q.shape[1], k.shape[1], per_query=False)
  return _xla_probs(q, k, allowed=allowed, row_real=row_real, scale=scale, bias=bias)


def _cudnn_attention(q, k, v, mask: Mask, head_mask, ablation, scale):
  if jax.default_backend() != "gpu":
    raise ValueError(f"impl='cudnn' needs a GPU, the backend is {jax.default_backend()!r}")
  if ablation != "scale" and head_mask is not None:
    raise ValueError(f"impl='cudnn' supports only ablation='scale' head masks, got {ablation=}")
  if mask.segment_ids is not None:
    raise ValueError("impl='cudnn' does not support segment_ids; use 'pallas' or 'xla'")
  kv_lengths = _fused_mask(q, k, mask).kv_lengths
  lengths = None if kv_lengths is None else jnp.asarray(kv_lengths, jnp.int32)
  out = jax.nn.dot_product_attention(
    q,
    k,
    v,
    scale=scale,
    query_seq_lengths=lengths,
    key_value_seq_lengths=lengths,
    implementation="cudnn",
  )
  if lengths is not None:
    real = jnp.arange(q.shape[1])[None, :] < lengths[:, None]  # (B, T)
    out = jnp.where(real[:, :, None, None], out, 0)
  if head_mask is not None:
    out = out * head_mask[:, None, :, None].astype(out.dtype)
  return out


def attention_with_stats(
  q,
  k,
  v,
  *,
  mask: Mask | None = None,
  kv_lengths=None,
  segment_ids=None,
  key_mask=None,
  head_mask=None,
  ablation: Ablation = "scale",
  special_mask=None,
  scale=None,
  impl="auto",
  interpret=None,
  block_sizes: BlockSizes | None = None,
  kernel_variant=None,
  dropout_rate=0.0,
  dropout_seed=None,
  bias: PositionBias | None = None,
):
  """Attention output plus per-head statistics of the attention, without T x T maps (pallas).

  The statistics describe the distribution that mixes the values (the softmax A before
  scaling in "scale" mode; `xi A + (1 - xi) U` in "uniform" mode), per query row, averaged
  over the real query rows (index < kv_length): "entropy" (nats), "first" (mass on key 0,
  [CLS]), "special" (mass on keys where `special_mask` is True; zeros without it), "self"
  (key == query), "prev" (key == query - 1), "next" (key == query + 1) (`STAT_NAMES`). They
  are not differentiable.

  Inference only: `dropout_rate` must be 0 (anything else raises; `dropout_seed` is then
  ignored).

  The arguments are `attention`'s (the mask too, taken by each implementation in its form),
  plus `special_mask`, bool `(batch, seq)`. `impl` is "auto" (pallas on GPU, xla elsewhere),
  "xla" or "pallas" (Triton variant only); "cudnn" has no statistics and raises.

  Returns:
    `(out, stats)`: out `(batch, seq, heads, head_dim)`; stats a dict of float32
    `(batch, heads)` arrays.
  """
  mask = mask_of(mask, kv_lengths, segment_ids, key_mask)
  head_mask = _validate(q, k, v, mask, head_mask, ablation, impl, special_mask, bias=bias)
  del dropout_seed  # only accepted so that a caller passing attention's arguments gets told
  if drop.check_rate(dropout_rate) > 0:
    raise ValueError(
      f"attention_with_stats is inference only: dropout_rate={dropout_rate} is not supported; "
      "use kernels.attention for training with dropout"
    )
  impl = _resolve_impl(impl, False, stats=True)
  if impl == "cudnn":
    raise ValueError("attention_with_stats supports impl 'xla' and 'pallas', got impl='cudnn'")
  if impl == "pallas":
    _check_fused_variants(impl, q, k, mask, bias, "triton")
  if impl == "xla":
    kwargs = {"mask": mask, "head_mask": head_mask, "ablation": ablation, "scale": scale}
    out = reference_attention(q, k, v, bias=bias, **kwargs)
    return out, reference_statistics(q, k, v, special_mask=special_mask, bias=bias, **kwargs)
  fused_mask = _fused_mask(q, k, mask)
  interpret, _ = _pallas_variant(interpret, kernel_variant, stats=True)
  return fa_stats.attention_statistics_pallas(
    q,
    k,
    v,
    bias=bias,
    mask=fused_mask,
    head_mask=head_mask,
    ablation=ablation,
    special_mask=special_mask,
    scale=scale,
    block_sizes=block_sizes,
    interpret=interpret,
  )

"""One intervention value: everything a pass does to the model's internals, as one pytree.

An `Intervention` holds the head mask, the layer mask, the patches (`(value, weight)`
arrays and functions), the subspace interchanges (`(source, basis, weight)`: a source's
coordinates on a basis swapped in, the interventions of causal abstraction) and the
capture list. `forward`, `run_layers` and
`attention_statistics` build one from their keywords at the public entry (or take one
built by the caller) and hand it whole down to `Sites`, which reads each block's slice.
A new kind of intervention is a field here and a read in `Sites`, not a keyword in every
signature on the way.

Its arrays are the pytree's leaves: traced under `jit`, batched by `vmap` (a stack of
interventions is one sweep), differentiated by `grad`. Its static part (`head_ablation`,
`capture`, the patch functions) is the treedef's auxiliary data, so a change there
compiles a new program and a change of the arrays does not.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.kernels import ABLATIONS
from bertjax.model.sites import SITES

# The keywords of `forward` (and `run_layers`) that an `Intervention` stands for.
KEYWORDS = ("head_mask", "head_ablation", "layer_mask", "capture", "patch")


@jax.tree_util.register_pytree_node_class
class Intervention:
  """What a pass does to a model's internals: masks, patches and captures.

  Args (keyword only, as `forward` takes them):
    head_mask: float (layers, heads) or (batch, layers, heads).
    head_ablation: "scale" or "uniform" (how `head_mask` acts; see `forward`).
    layer_mask: float (layers,): a block's output becomes `m * block(x) + (1 - m) * x`.
    capture: site names (`bertjax.SITES`) to return in `out.cache`.
    patch: {site: (value, weight)} or {site: fn(value, index)} (see `forward`).
    subspace: {site: (source, basis, weight)}: an interchange intervention on a subspace of
      a block site's last axis (width D): with `basis` (k, D) (or (depth, k, D)) whose rows
      are orthonormal, the site becomes `h + (((source - h) @ basis.T) * weight) @ basis`:
      coordinate j of `h` on the basis moves to `source`'s by `weight[..., j]` (1 swaps it,
      0 leaves it), the rest of `h` untouched. `source` broadcasts to the site's stacked
      shape (a capture of the counterfactual run), `weight` to that shape with k in place
      of D (its depth, batch and position axes pick where: a layer, the tokens). The basis
      of distributed alignment search (Geiger et al. 2024) is learned, a rotation's first
      k rows; DBM learns `weight` over a given basis. Differentiable in all three.

  Attributes:
    head_mask, layer_mask: as given (NumPy or JAX arrays), or None.
    patch: {site: (value, weight)}: the array patches.
    subspace: {site: (source, basis, weight)}: the subspace interchanges.
    head_ablation: str (static).
    capture: sorted tuple of site names (static).
    functions: sorted tuple of (site, fn): the function patches (static: define a function
      once, not a new lambda per call, so that it compiles once).

  Shapes are checked against a model where it is used (`forward` and `run_layers` check
  it as they check their keywords); its structure (pairs, numbers, names) here.
  """

  __slots__ = (
    "capture",
    "functions",
    "head_ablation",
    "head_mask",
    "layer_mask",
    "patch",
    "subspace",
  )

  def __init__(
    self,
    *,
    head_mask=None,
    head_ablation="scale",
    layer_mask=None,
    capture=(),
    patch=None,
    subspace=None,
  ):
    if head_ablation not in ABLATIONS:
      raise ValueError(f"{head_ablation=!r} must be one of {ABLATIONS}")
    if patch is not None and not isinstance(patch, Mapping):
      raise ValueError(
        f"patch must be a dict {{site: (value, weight)}}; got {type(patch).__name__}"
      )
    arrays, functions = {}, []
    for site, entry in (patch or {}).items():
      if callable(entry):
        functions.append((site, entry))
      elif isinstance(entry, (tuple, list)) and len(entry) == 2:
        arrays[site] = tuple(
          _patch_array(site, what, a) for what, a in zip(("value", "weight"), entry)
        )
      else:
        raise ValueError(
          f"patch[{site!r}] must be a (value, weight) pair or a function "
          f"fn(value, index); got {type(entry).__name__}"
        )
    if subspace is not None and not isinstance(subspace, Mapping):
      raise ValueError(
        f"subspace must be a dict {{site: (source, basis, weight)}}; got {type(subspace).__name__}"
      )
    swaps = {}
    for site, entry in (subspace or {}).items():
      if not (isinstance(entry, (tuple, list)) and len(entry) == 3):
        raise ValueError(
          f"subspace[{site!r}] must be a (source, basis, weight) triple; got {type(entry).__name__}"
        )
      swaps[site] = tuple(
        _patch_array(site, what, a, "subspace")
        for what, a in zip(("source", "basis", "weight"), entry)
      )
    self.head_mask = as_array(head_mask)
    self.layer_mask = as_array(layer_mask)
    self.patch = arrays
    self.subspace = swaps
    self.head_ablation = head_ablation
    self.capture = capture_tuple(capture)
    self.functions = tuple(sorted(functions, key=lambda p: p[0]))

  # The pytree: arrays as children, the rest as static auxiliary data.

  def tree_flatten(self):
    """`((head_mask, layer_mask, patch, subspace), (head_ablation, capture, functions))`: the
    arrays as children, the rest as the treedef's static data."""
    children = (self.head_mask, self.layer_mask, self.patch, self.subspace)
    return children, (self.head_ablation, self.capture, self.functions)

  @classmethod
  def tree_unflatten(cls, static, children):
    """The inverse of `tree_flatten` (no checks: the leaves may be tracers or placeholders)."""
    new = object.__new__(cls)  # leaves may be tracers or placeholders: no checks here
    new.head_mask, new.layer_mask, new.patch, new.subspace = children
    new.head_ablation, new.capture, new.functions = static
    return new

  def replace(self, **changes) -> Intervention:
    """A copy with some fields replaced (unchecked: fields as the attributes hold them)."""
    children, static = self.tree_flatten()
    new = Intervention.tree_unflatten(static, children)
    for name, value in changes.items():
      setattr(new, name, value)
    return new

  def __repr__(self) -> str:
    shape = lambda a: None if a is None else tuple(jnp.shape(a))
    parts = [
      f"head_mask={shape(self.head_mask)}",
      f"head_ablation={self.head_ablation!r}",
      f"layer_mask={shape(self.layer_mask)}",
      f"capture={self.capture}",
      f"patch={ {s: tuple(shape(a) for a in e) for s, e in self.patch.items()} }",
      f"functions={[s for s, _ in self.functions]}",
      f"subspace={ {s: tuple(shape(a) for a in e) for s, e in self.subspace.items()} }",
    ]
    return f"Intervention({', '.join(parts)})"

  # What the checks and the blocks read.

  @property
  def patches(self) -> dict:
    """Every patch, arrays and functions, keyed by site (as `forward`'s `patch=`)."""
    return {**self.patch, **dict(self.functions)}

  @property
  def touched(self) -> frozenset[str]:
    """The sites this intervention captures, patches, edits by a function or interchanges."""
    return (
      frozenset(self.capture)
      | frozenset(self.patch)
      | {s for s, _ in self.functions}
      | frozenset(self.subspace)
    )

  def without(self, site: str) -> Intervention:
    """This intervention with nothing at `site` (the embeddings, which `embed` applies)."""
    return self.replace(
      patch={s: e for s, e in self.patch.items() if s != site},
      capture=tuple(c for c in self.capture if c != site),
      functions=tuple(p for p in self.functions if p[0] != site),
      subspace={s: e for s, e in self.subspace.items() if s != site},
    )

  def blocks(self, config, start: int, stop: int) -> tuple[Intervention, Intervention]:
    """`(scanned, constant)` for blocks `start .. stop-1`.

    `scanned`'s arrays lead with those blocks (the `xs` of the layer scan): the head mask
    as (blocks, N), (blocks, B, N) or, on packed rows, (blocks, R, P, N); the layer mask
    (blocks,); patch arrays whose depth axis has size `config.depth`. Patch arrays that
    broadcast over depth (leading size 1, or fewer axes) go to `constant` instead, so a
    weight like `(1, 1, 1, N, 1)` is never copied per block; a patch entry missing from
    one of the two is None there. Block `i`'s own intervention is
    `scanned[i].join(constant)` (`jax.tree.map(lambda a: a[i], scanned)` for `scanned[i]`).
    """
    head_mask = self.head_mask
    if head_mask is not None:
      head_mask = jnp.asarray(head_mask)
      if head_mask.ndim > 2:  # (B, L, N) or, packed, per token (R, P, L, N): blocks first
        head_mask = jnp.moveaxis(head_mask, head_mask.ndim - 2, 0)
      head_mask = head_mask[start:stop]
    layer_mask = None if self.layer_mask is None else jnp.asarray(self.layer_mask)[start:stop]

    def split(entries, ranks):
      # Each entry's arrays with a depth axis to `scanned`, the others to `constant`.
      scanned, constant = {}, {}
      for site, entry in entries.items():
        rank = len(SITES[site][0].split()) + 1
        got_s, got_c = [None] * len(entry), [None] * len(entry)
        for i, array in enumerate(entry):
          array = jnp.asarray(array)
          r = rank if ranks[i] is None else ranks[i]
          array = array.reshape((1,) * (r - array.ndim) + array.shape)
          if array.shape[0] == config.depth and config.depth > 1:
            got_s[i] = array[start:stop]
          else:
            got_c[i] = array[0]
        scanned[site], constant[site] = tuple(got_s), tuple(got_c)
      return scanned, constant

    patch_s, patch_c = split(self.patch, (None, None))
    swap_s, swap_c = split(self.subspace, (None, 3, None))  # a basis is (depth?, k, D)
    return (
      self.replace(head_mask=head_mask, layer_mask=layer_mask, patch=patch_s, subspace=swap_s),
      self.replace(head_mask=None, layer_mask=None, patch=patch_c, subspace=swap_c),
    )

  def join(self, constant: Intervention) -> Intervention:
    """One block's intervention: this block slice of `blocks`' scanned part, its gaps filled
    from the constant part."""
    fill = lambda mine, theirs: {
      site: tuple(a if a is not None else b for a, b in zip(entry, theirs[site]))
      for site, entry in mine.items()
    }
    return self.replace(
      patch=fill(self.patch, constant.patch), subspace=fill(self.subspace, constant.subspace)
    )


def as_array(x):
  """Lists, tuples and other array-likes (NumPy, torch CPU tensors) as NumPy; JAX arrays as is."""
  if x is None or isinstance(x, (jax.Array, jax.core.Tracer)):
    return x
  return np.asarray(x)


def capture_tuple(capture) -> tuple[str, ...]:
  """`capture` as a sorted tuple of names (None: none; one string: that site)."""
  if capture is None:
    return ()
  if isinstance(capture, str):
    capture = (capture,)
  try:
    names = tuple(capture)
  except TypeError:
    raise ValueError(f"capture={capture!r} must be site names (a tuple of str)") from None
  bad = [c for c in names if not isinstance(c, str)]
  if bad:
    raise ValueError(
      f"capture entries {bad!r} are not site names (str); expected names from {tuple(SITES)}"
    )
  return tuple(sorted(set(names)))


def _patch_array(site, what, array, kind="patch"):
  """A patch (or subspace) array as an array (as the inputs are), or a ValueError naming it."""
  given = array
  try:
    array = np.asarray(None) if array is None else as_array(array)
  except (TypeError, RuntimeError) as e:  # e.g. a torch tensor on a GPU or needing grad
    raise ValueError(
      f"{kind}[{site!r}] {what} cannot be read as an array ({e}); pass a "
      "NumPy or JAX array (a torch tensor: .detach().cpu())"
    ) from None
  if not (jnp.issubdtype(array.dtype, jnp.number) or jnp.issubdtype(array.dtype, jnp.bool_)):
    raise ValueError(
      f"{kind}[{site!r}] {what} must be a number or an array of numbers; got {type(given).__name__}"
    )
  return array


def intervention_of(intervention: Intervention | None, **keywords) -> Intervention:
  """The pass's `Intervention`: the one given, or one built from `forward`'s keywords
  (`KEYWORDS`); both at once is an error naming the keywords."""
  if intervention is None:
    return Intervention(**keywords)
  if not isinstance(intervention, Intervention):
    raise TypeError(
      f"intervention must be a bertjax.Intervention; got {type(intervention).__name__}"
    )
  given = [
    k
    for k, v in keywords.items()
    if (k == "head_ablation" and v != "scale")
    or (k == "capture" and v not in (None, ()))
    or (k not in ("head_ablation", "capture") and v is not None)
  ]
  if given:
    raise ValueError(
      f"pass either intervention= or its keywords {given}, not both (put them in the Intervention)"
    )
  return intervention

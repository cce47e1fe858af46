"""Hugging Face checkpoints in and out, for every family in `bertjax.model.families`.

`config.json` + `model.safetensors` (or `pytorch_model.bin`, or either sharded
with an `.index.json`), from a directory or a hub id through the
`huggingface_hub` cache. Explicit name maps, one entry per tensor: our
parameter path, the Hugging Face name (from the family's row), and how the
array is laid out on each side. Torch `nn.Linear` stores `(out, in)`; we store
`(in, out)` and split heads onto their own axis.
"""

from __future__ import annotations

import json
import os
import pathlib
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import jax
import numpy as np

from bertjax.model.config import BertConfig
from bertjax.model.families import FUSED, HEADS, LAYER_ROLES, NORM_ROLES
from bertjax.model.layers import Params

# How a tensor is stored here vs in torch; `to_hf` and `from_hf` are inverses.
# Each kind maps (our array, config) -> torch array and back.
_Kind = tuple[
  Callable[[np.ndarray, BertConfig], np.ndarray], Callable[[np.ndarray, BertConfig], np.ndarray]
]
_KINDS: dict[str, _Kind] = {
  "plain": (lambda a, c: a, lambda a, c: a),
  "linear": (lambda a, c: a.T, lambda a, c: a.T),
  # query/key/value kernels: ours (H, N, D), torch (N*D, H).
  # (N varies per layer in a pruned model, and is the key/value heads for k and v.)
  "qkv": (
    lambda a, c: a.reshape(a.shape[0], -1).T,
    lambda a, c: a.T.reshape(a.shape[1], -1, c.head_dim),
  ),
  "qkv_bias": (lambda a, c: a.reshape(-1), lambda a, c: a.reshape(-1, c.head_dim)),
  # attention output kernel: ours (N, D, H), torch (H, N*D).
  "out": (
    lambda a, c: a.reshape(-1, a.shape[-1]).T,
    lambda a, c: a.T.reshape(-1, c.head_dim, a.shape[0]),
  ),
}
# The kind of each layer role's kernel (its bias is "qkv_bias" for q/k/v, else "plain").
_ROLE_KINDS = {
  "query": "qkv",
  "key": "qkv",
  "value": "qkv",
  "attn_output": "out",
  "ffn_in": "linear",
  "ffn_gate": "linear",
  "ffn_out": "linear",
  "pos_key": "qkv",
  "pos_query": "qkv",
}
_ATTENTION_ROLES = ("query", "key", "value", "attn_output", "pos_key", "pos_query")


def _has_role(config: BertConfig, role: str) -> bool:
  """Whether this config's block has the role's tensors (DeBERTa's position projections
  exist for the terms it uses, unless `share_att_key` reuses the content ones)."""
  if role in ("pos_key", "pos_query"):
    term = "c2p" if role == "pos_key" else "p2c"
    return term in config.disentangled_terms and not config.share_att_key
  return True


def _role_tensors(config: BertConfig, role: str):
  """(our sub-path under the layer, suffix, kind) of one role's tensors in `config`."""
  path = LAYER_ROLES[role]
  if role in NORM_ROLES:
    bias = config.norm_bias and config.family.norm_kind == "layernorm"
    return [(path + ("scale",), "weight", "plain")] + (
      [(path + ("bias",), "bias", "plain")] if bias else []
    )
  bias = config.attention_bias if role in _ATTENTION_ROLES else config.mlp_bias
  kernel = _ROLE_KINDS[role]
  return [(path + ("kernel",), "weight", kernel)] + (
    [(path + ("bias",), "bias", "qkv_bias" if kernel == "qkv" else "plain")] if bias else []
  )


def _layer_entries(config: BertConfig, layer: int):
  """(Hugging Face suffix, [our sub-paths], kind) of one parameter layer's tensors; a fused
  tensor (ModernBERT's Wqkv, Wi) lists the sub-paths it holds, in order."""
  fam = config.family
  entries = []
  for name, hf in fam.layer_names.items():
    if name == "attn_norm" and layer == 0 and not fam.first_attn_norm:
      continue  # ModernBERT's block 0 has no attention norm
    if not _has_role(config, name):
      continue
    if name in FUSED:
      parts = [_role_tensors(config, role) for role in FUSED[name]]
      for i, (_, suffix, kind) in enumerate(parts[0]):
        if name == "qkv_per_head":  # interleaved by head, not concatenated
          kind = f"per_head:{kind}"
        entries.append((f"{hf}.{suffix}", [part[i][0] for part in parts], kind))
    else:
      entries += [
        (f"{hf}.{suffix}", [path], kind) for path, suffix, kind in _role_tensors(config, name)
      ]
  return entries


def _name_map(config: BertConfig, heads: tuple[str, ...], pooler: bool):
  """(hf_name, [our paths], param_layer or None, kind) for every tensor of the model."""
  fam = config.family
  base = fam.prefix + "."
  entries = []
  names = fam.embedding_names
  tables = [("word", "word_embeddings")]
  if config.position_table is not None:
    tables.append(("position", "position_embeddings"))
  if config.type_vocab_size:
    tables.append(("token_type", "token_type_embeddings"))
  for role, ours in tables:
    entries.append(
      (f"{base}{names[role]}.weight", [("embeddings", ours, "embedding")], None, "plain")
    )
  if "norm" in names:
    norm_bias = ["bias"] if config.norm_bias else []
    for ours, theirs in [("scale", "weight")] + [("bias", "bias")] * len(norm_bias):
      entries.append(
        (f"{base}{names['norm']}.{theirs}", [("embeddings", "LayerNorm", ours)], None, "plain")
      )
  if config.has_embedding_projection:
    parts = (("kernel", "weight", "linear"),) + (
      (("bias", "bias", "plain"),) if fam.projection_bias else ()
    )
    for ours, theirs, kind in parts:
      entries.append(
        (f"{base}{fam.projection}.{theirs}", [("embeddings", "projection", ours)], None, kind)
      )
  if fam.position_bias == "relative_buckets":
    entries.append(
      (
        f"{base}{fam.relative_bias}.weight",
        [("encoder", "relative_attention_bias", "embedding")],
        None,
        "plain",
      )
    )
  elif config.disentangled_terms:
    entries.append(
      (
        f"{base}{fam.relative_bias}.weight",
        [("encoder", "rel_embeddings", "embedding")],
        None,
        "plain",
      )
    )
    if config.norm_rel_ebd == "layer_norm":
      entries += [
        (f"{base}{fam.relative_norm}.{theirs}", [("encoder", "rel_norm", ours)], None, "plain")
        for ours, theirs in (("scale", "weight"), ("bias", "bias"))
      ]
  for p in range(config.num_param_layers):
    g, j = divmod(p, config.inner_group_num)
    prefix = base + fam.layer_prefix.format(i=p, g=g, j=j)
    for suffix, paths, kind in _layer_entries(config, p):
      entries.append((prefix + suffix, [("encoder", "layers") + sub for sub in paths], p, kind))
  if fam.final_norm:
    for path, suffix, kind in _role_tensors(config, "attn_norm"):
      entries.append(
        (f"{base}{fam.final_norm}.{suffix}", [("encoder", "LayerNorm", path[-1])], None, kind)
      )
  if pooler:
    for ours, theirs, kind in (("kernel", "weight", "linear"), ("bias", "bias", "plain")):
      entries.append((f"{base}{fam.pooler}.{theirs}", [("pooler", "dense", ours)], None, kind))
  for head in heads:
    entries += [
      (name, [(head,) + sub], None, kind) for sub, name, kind in fam.heads[head].present(config)
    ]
  return entries


def _to_torch(kind: str, arrays: list[np.ndarray], config: BertConfig) -> np.ndarray:
  """Our arrays (one, or the parts of a fused tensor) as one torch-layout array; a
  "per_head:" kind interleaves the parts head by head (NeoBERT: q_0 k_0 v_0 q_1 ...)."""
  per_head = kind.startswith("per_head:")
  kind = kind.removeprefix("per_head:")
  parts = [_KINDS[kind][0](a, config) for a in arrays]
  if per_head:  # (N D, ...) each -> (N, parts, D, ...) -> (N parts D, ...)
    split = [p.reshape(-1, config.head_dim, *p.shape[1:]) for p in parts]
    return np.stack(split, axis=1).reshape(-1, *parts[0].shape[1:])
  return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)


def _from_torch(
  kind: str, array: np.ndarray, config: BertConfig, sizes: list[int]
) -> list[np.ndarray]:
  """A torch-layout array as our arrays; a fused one split into parts of `sizes` rows (or,
  for a "per_head:" kind, into its parts head by head)."""
  if kind.startswith("per_head:"):
    kind = kind.removeprefix("per_head:")
    grouped = array.reshape(-1, len(sizes), config.head_dim, *array.shape[1:])
    parts = [grouped[:, i].reshape(-1, *array.shape[1:]) for i in range(len(sizes))]
  else:
    parts = np.split(array, np.cumsum(sizes)[:-1], axis=0)
  return [_KINDS[kind][1](part, config) for part in parts]


def _tied_names(config: BertConfig) -> set[str]:
  fam = config.family
  tied = {name for head in fam.heads.values() for name in head.tied}
  # A name that is a real tensor in this config (EuroBERT's untied decoder) is not tied.
  real = {name for head in fam.heads.values() for _, name, _ in head.present(config)}
  return tied - real


def _head_names(config: BertConfig) -> set[str]:
  return {name for head in config.family.heads.values() for name in head.names + head.tied}


# Reading --------------------------------------------------------------------


def _read_safetensors(file: pathlib.Path) -> dict[str, np.ndarray]:
  from safetensors import SafetensorError, safe_open

  state = {}
  try:
    with safe_open(str(file), framework="numpy") as f:
      for name in f.keys():  # noqa: SIM118 (safe_open is not iterable)
        try:
          state[name] = f.get_tensor(name)
        except (TypeError, ValueError):  # bfloat16 has no NumPy dtype: go through torch.
          with safe_open(str(file), framework="pt") as g:
            state[name] = g.get_tensor(name).float().numpy()
  except SafetensorError as e:
    raise ValueError(
      f"{file} cannot be read as safetensors ({e}); is it truncated or "
      "corrupt? Download or export it again"
    ) from None
  return state


def _read_torch(file: pathlib.Path) -> dict[str, np.ndarray]:
  import pickle
  import zipfile

  import torch

  try:
    raw = torch.load(str(file), map_location="cpu", weights_only=True)
  except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile) as e:
    raise ValueError(
      f"{file} cannot be read as a PyTorch checkpoint "
      f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); is it "
      "truncated or corrupt?"
    ) from None
  return {k: v.float().numpy() for k, v in raw.items()}


def _read_state_dict(path: pathlib.Path) -> dict[str, np.ndarray]:
  """Every tensor of a checkpoint directory: one file, or shards listed by an index."""
  for single, read in (
    ("model.safetensors", _read_safetensors),
    ("pytorch_model.bin", _read_torch),
  ):
    if (path / single).exists():
      return read(path / single)
    index = path / f"{single}.index.json"
    if index.exists():
      weight_map = json.loads(index.read_text()).get("weight_map") or {}
      shards = sorted(set(weight_map.values()))
      missing = [s for s in shards if not (path / s).exists()]
      if not shards or missing:
        raise FileNotFoundError(f"{index} lists shards {missing or shards} that are not in {path}")
      state = {}
      for shard in shards:
        state.update(read(path / shard))
      return state
  raise FileNotFoundError(f"no model.safetensors, pytorch_model.bin or their .index.json in {path}")


def _normalise_name(name: str) -> str:
  # Old TF-converted checkpoints call LayerNorm parameters gamma and beta.
  if name.endswith(".gamma"):
    return name[: -len(".gamma")] + ".weight"
  if name.endswith(".beta"):
    return name[: -len(".beta")] + ".bias"
  return name


HUB_FILES = ["*.json", "*.safetensors", "*.bin", "*.txt", "*.model", "merges.txt"]


def resolve_model_path(
  name: str | os.PathLike, cache_dir: str | os.PathLike | None = None
) -> pathlib.Path:
  """A model directory from a path or a Hugging Face hub id ("org/name").

  A hub id is looked up in the `huggingface_hub` cache (`cache_dir`, default
  `$HF_HOME/hub`), and downloaded into it when the network is allowed
  (`HF_HUB_OFFLINE` unset).

  Raises:
    FileNotFoundError: neither a directory nor a cached (or downloadable) hub
      model; the message names the id and the cache directory.
  """
  path = pathlib.Path(name).expanduser()
  if path.is_dir():
    return path
  if path.is_file():
    raise FileNotFoundError(
      f"{str(name)!r} is a file; a model is its folder: pass {str(path.parent)!r}"
    )
  text = str(name)
  if path.exists() or text.startswith((".", "/", "~")) or text.count("/") > 1:
    raise FileNotFoundError(f"model directory {text!r} does not exist")
  try:
    import huggingface_hub
    from huggingface_hub import constants
  except ImportError as e:
    raise FileNotFoundError(
      f"{text!r} is not a directory, and reading hub ids needs "
      "huggingface_hub (pip install 'bertjax[hf]')"
    ) from e
  try:
    return pathlib.Path(
      huggingface_hub.snapshot_download(
        text, allow_patterns=HUB_FILES, cache_dir=None if cache_dir is None else str(cache_dir)
      )
    )
  except Exception as e:  # noqa: BLE001 (offline, not cached, unknown repo, no network)
    offline = " (HF_HUB_OFFLINE is set)" if constants.HF_HUB_OFFLINE else ""
    raise FileNotFoundError(
      f"{text!r} is neither a model directory nor a model in the Hugging Face cache at "
      f"{cache_dir or constants.HF_HUB_CACHE}, and it could not be downloaded{offline}: "
      f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    ) from None


def from_hf(
  path: str | os.PathLike,
  *,
  cache_dir: str | os.PathLike | None = None,
  allow_unknown_keys: Iterable[str] = (),
  **config_overrides: Any,
) -> tuple[BertConfig, Params]:
  """Loads a Hugging Face model of any family in `bertjax.model.families`.

  Reads `config.json` and `model.safetensors` (or `pytorch_model.bin`, or their
  shards), with or without the base-model prefix (`bert.`, `roberta.` ...) and
  with the task heads present (see `Family.heads`).

  Args:
    path: a model directory, or a hub id resolved through the `huggingface_hub`
      cache (see `resolve_model_path`).
    cache_dir: the hub cache to use instead of `$HF_HOME/hub`.
    allow_unknown_keys: `config.json` keys to load without. Any key the family's row
      neither reads nor knows to change nothing is refused by name, since it may change
      the model; name one here only once you know it does not.
    **config_overrides: fields of `BertConfig` to set, e.g. `dtype="bfloat16"`,
      `attention_impl="pallas"`.

  Returns:
    `(config, params)`.

  Raises:
    ValueError: unknown `model_type`, `config.json` keys bertjax does not know or values it
      does not implement, or missing, unexpected or mis-shaped tensors (all of them listed).
  """
  path = resolve_model_path(path, cache_dir)
  config_file = path / "config.json"
  if not config_file.exists():
    raise FileNotFoundError(f"no config.json in {path}")
  try:
    hf_config = json.loads(config_file.read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{config_file} is not valid JSON ({e}); is it truncated or edited?") from None
  config = BertConfig.from_hf_dict(hf_config, allow_unknown_keys=allow_unknown_keys)
  fam = config.family
  state = {_normalise_name(k): v for k, v in _read_state_dict(path).items()}

  base = fam.prefix + "."
  head_names = _head_names(config)
  if not any(k.startswith(base) for k in state):  # a base model saved without its prefix
    state = {(k if k in head_names else base + k): v for k, v in state.items()}
  if (
    fam.heads.get("mlm")
    and getattr(config.options, "legacy", False)
    and "lm_predictions.lm_head.dense.weight" in state
    and "cls.predictions.transform.dense.weight" not in state
  ):
    # DeBERTa's own MLM head layout, as the released v3 checkpoints hold it (their
    # config.json leaves `legacy` at its default, with which transformers would not load it).
    config = config.replace(legacy=False)
  heads = _detect_heads(config, state, hf_config)
  pooler = fam.pooler is not None and any(k.startswith(f"{base}{fam.pooler}.") for k in state)
  config = config.replace(use_pooler=pooler, **config_overrides)
  for head in ("classifier", "token_classifier", "sop"):
    if head in heads:
      labels = state[fam.heads[head].names[-2]].shape[0]  # the last dense layer's weight
      if labels != config.num_labels:
        config = config.replace(num_labels=labels, label_names=None)
  params = _params_from_state(config, heads, state)
  return config, params


def _detect_heads(
  config: BertConfig, state: dict[str, np.ndarray], hf_config: dict[str, Any]
) -> tuple[str, ...]:
  """The task heads whose tensors the checkpoint holds.

  A head whose tensors are all part of another present head's (a linear token classifier
  inside RoBERTa's two-layer classifier; ModernBERT's MLM transform inside its classifier)
  is not a head of its own; two heads with the same tensors (BERT's and ModernBERT's
  sequence and token classifiers) are told apart by config.json's `architectures`.
  """
  fam = config.family
  names = {h: {name for _, name, _ in spec.present(config)} for h, spec in fam.heads.items()}
  heads = [h for h in fam.heads if names[h] <= set(state)]
  heads = [h for h in heads if not any(names[h] < names[o] for o in heads)]
  if "classifier" in heads and "token_classifier" in heads:
    archs = " ".join(hf_config.get("architectures") or [])
    heads.remove("classifier" if "TokenClassification" in archs else "token_classifier")
  return tuple(heads)


def _params_from_state(
  config: BertConfig, heads: tuple[str, ...], state: dict[str, np.ndarray]
) -> Params:
  entries = _name_map(config, heads, config.has_pooler)
  expected = {name for name, *_ in entries}
  ignorable = _tied_names(config) | {
    k
    for k in state
    if k.endswith(("position_ids", "inv_freq")) or k.startswith(config.family.ignored_prefixes)
  }
  missing = sorted(expected - set(state))
  unexpected = sorted(set(state) - expected - ignorable)
  shapes = _expected_shapes(config, heads)
  wrong = [
    f"{name}: {state[name].shape} != expected {shapes[name]}"
    for name, *_ in entries
    if name in state and state[name].shape != shapes[name]
  ]
  if missing or unexpected or wrong:
    raise ValueError(
      f"checkpoint does not match a {config.model_type} model with heads {list(heads)}:\n"
      f"  missing ({len(missing)}): {missing}\n  unexpected ({len(unexpected)}): {unexpected}\n"
      f"  wrong shape ({len(wrong)}): {wrong}"
    )

  abstract = _abstract(config, heads)
  per_layer: dict[tuple[str, ...], list] = {}
  flat: dict[tuple[str, ...], np.ndarray] = {}
  for name, paths, layer, kind in entries:
    sizes = [_torch_rows(kind, _shape(abstract, path, layer), config) for path in paths]
    arrays = _from_torch(kind, np.asarray(state[name], np.float32), config, sizes)
    for path, array in zip(paths, arrays):
      if layer is None:
        flat[path] = array
      else:
        per_layer.setdefault(path, [None] * config.num_param_layers)[layer] = array
  for path, arrays in per_layer.items():  # a tensor a layer lacks (ModernBERT's first norm)
    for i, array in enumerate(arrays):
      if array is None:
        arrays[i] = np.full(
          _shape(abstract, path, i), 1.0 if path[-1] == "scale" else 0.0, np.float32
        )
  # Stacked in NumPy and placed with device_put: `jnp.asarray` and `jnp.stack` would each
  # compile a program per shape (about 40 for a BERT).
  params = _unflatten({k: jax.device_put(v) for k, v in flat.items()})
  if config.is_pruned:  # head counts differ between layers: a list, not a stack
    layers = [
      _unflatten({path[2:]: jax.device_put(arrays[i]) for path, arrays in per_layer.items()})
      for i in range(config.num_param_layers)
    ]
  else:
    layers = _unflatten({path[2:]: jax.device_put(np.stack(a)) for path, a in per_layer.items()})
  params.setdefault("encoder", {})["layers"] = layers
  return params


def _abstract(config: BertConfig, heads: tuple[str, ...]):
  from bertjax.model.forward import init

  return jax.eval_shape(lambda: init(config, 0, heads))


def _shape(abstract, path, layer) -> tuple[int, ...]:
  """Our shape of the array at `path` (a layer parameter without its stacked axis)."""
  layers = abstract["encoder"]["layers"]
  if layer is not None and not isinstance(layers, list):
    return _leaf(abstract, path, None).shape[1:]
  return _leaf(abstract, path, layer).shape


def _torch_rows(kind: str, shape: tuple[int, ...], config: BertConfig) -> int:
  return _KINDS[kind.removeprefix("per_head:")][0](np.zeros(shape, np.float32), config).shape[0]


def _expected_shapes(config: BertConfig, heads: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
  """Torch-side shapes of every tensor, derived from freshly initialised parameters."""
  abstract = _abstract(config, heads)
  return {
    name: _to_torch(
      kind, [np.zeros(_shape(abstract, path, layer), np.float32) for path in paths], config
    ).shape
    for name, paths, layer, kind in _name_map(config, heads, config.has_pooler)
  }


def _leaf(tree, path, layer):
  """The array at `path`; for a layer parameter, that layer's slice (stacked or listed)."""
  if layer is not None:
    layers = tree["encoder"]["layers"]
    if isinstance(layers, list):
      tree, path, layer = layers[layer], path[2:], None
  for key in path:
    tree = tree[key]
  return tree if layer is None else tree[layer]


def _unflatten(flat: dict[tuple[str, ...], Any]) -> Params:
  tree: Params = {}
  for path, value in flat.items():
    node = tree
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
  return tree


# Writing --------------------------------------------------------------------


def hf_state_dict(config: BertConfig, params: Params) -> tuple[dict[str, np.ndarray], str]:
  """Our parameters as a Hugging Face state dict (float32 NumPy) and the architecture name."""
  heads = tuple(h for h in HEADS if h in params)
  arch = config.family.architecture(heads)
  pooler = "pooler" in params and arch not in config.family.no_pooler
  if "pooler" in params and not pooler:
    warnings.warn(f"{arch} has no pooler in Hugging Face; the pooler is not written")
  with_prefix = bool(heads)
  params = jax.device_get(params)  # one copy to NumPy: slicing device arrays compiles programs
  state = {}
  for name, paths, layer, kind in _name_map(config, heads, pooler):
    arrays = [np.asarray(_leaf(params, path, layer), np.float32) for path in paths]
    if not with_prefix:
      name = name.split(".", 1)[1]
    state[name] = np.ascontiguousarray(_to_torch(kind, arrays, config))
  return state, arch


_UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def _parse_size(size: int | str | None) -> int | None:
  if size is None or isinstance(size, int):
    return size
  text = str(size).strip().upper()
  for unit, factor in sorted(_UNITS.items(), key=lambda u: -len(u[0])):
    if text.endswith(unit):
      return int(float(text[: -len(unit)]) * factor)
  raise ValueError(f"max_shard_size={size!r} must be an int (bytes) or like '500MB', '2GB'")


def _shards(state: dict[str, np.ndarray], limit: int | None) -> list[dict[str, np.ndarray]]:
  """Tensors split into shards of at most `limit` bytes each (a larger tensor alone)."""
  if limit is None or sum(a.nbytes for a in state.values()) <= limit:
    return [state]
  shards, current, size = [], {}, 0
  for name, array in state.items():
    if current and size + array.nbytes > limit:
      shards.append(current)
      current, size = {}, 0
    current[name] = array
    size += array.nbytes
  return shards + [current]


PRUNED_FORMATS = ("zeros", "remove")


def to_hf(
  config: BertConfig,
  params: Params,
  path: str | pathlib.Path,
  *,
  max_shard_size: int | str | None = "5GB",
  pruned: str = "zeros",
) -> None:
  """Writes `config.json` (with `model_type` and `architectures`) and the weights.

  The result loads in `transformers` with no missing or unexpected keys. The
  architecture follows the heads present in `params`. Weights above
  `max_shard_size` (bytes, or a string like "500MB"; None never shards) are
  written as `model-0000i-of-0000n.safetensors` shards with a
  `model.safetensors.index.json`, as the hub's larger models are.

  A model with physically removed heads (`prune_heads`) is written as `pruned` says:
  "zeros" (default) at full size with the removed heads' weights zero
  (`functional.unprune_heads`: the same function, and what transformers 5 loads: it has
  no head pruning since 5.0); "remove" in transformers 4's layout, the smaller tensors
  and `pruned_heads` in config.json, which only transformers < 5 (4.57 and earlier)
  loads (5.x raises a size mismatch). `from_hf` reads both.
  """
  from safetensors.numpy import save_file

  from bertjax.model.prune import unprune_heads

  if pruned not in PRUNED_FORMATS:
    raise ValueError(f"pruned={pruned!r} must be one of {PRUNED_FORMATS}")
  if pruned == "zeros":
    config, params = unprune_heads(config, params)
  limit = _parse_size(max_shard_size)
  state, arch = hf_state_dict(config, params)
  hf_config = config.to_hf_dict([arch])
  path = pathlib.Path(path)
  path.mkdir(parents=True, exist_ok=True)
  umask = os.umask(0)
  os.umask(umask)
  shards = _shards(state, limit)
  names = (
    ["model.safetensors"]
    if len(shards) == 1
    else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
  )
  files = {}
  # Write to temporaries, then rename: a crash never leaves a half-written model.
  for name, shard in zip(names, shards):
    tmp = path / f"{name}.tmp"
    save_file(shard, str(tmp), metadata={"format": "pt"})
    files[name] = tmp
  if len(shards) > 1:
    index = {
      "metadata": {"total_size": int(sum(a.nbytes for a in state.values()))},
      "weight_map": {k: n for n, shard in zip(names, shards) for k in shard},
    }
    files["model.safetensors.index.json"] = path / "model.safetensors.index.json.tmp"
    files["model.safetensors.index.json"].write_text(json.dumps(index, indent=2) + "\n")
  files["config.json"] = path / "config.json.tmp"
  files["config.json"].write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
  for name, tmp in files.items():
    os.chmod(tmp, 0o666 & ~umask)  # readable by others, as a plain file would be
    tmp.replace(path / name)
  stale = ["model.safetensors"] if len(shards) > 1 else ["model.safetensors.index.json"]
  for name in stale:  # a previous export of the other layout would shadow this one
    (path / name).unlink(missing_ok=True)

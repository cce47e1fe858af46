"""Named sites: capture and patch against PyTorch forward hooks on the real MiniLM checkpoint.

Each captured site equals the same quantity read from transformers with hooks
(within 1e-5 at real tokens); patching `head_out` of chosen heads from run B
into run A equals the same edit made by a PyTorch hook; weight 0 is bitwise
the unpatched forward; d/d weight matches central differences in float64;
patches vmap and compose with prefix reuse and pruned models.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax.model.sites import ROW_AXIS, block_sites, take_rows

SENTENCES_A = ["The keys to the cabinet are on the table.", "She did not like it at all.", "Why?"]
SENTENCES_B = ["The key to the cabinets is on the tables.", "She did like it a lot.", "Because."]


def _torch_sites(model, batch):
  """Every site of every layer read with forward hooks, as NumPy (layer, ...) stacks."""
  import torch

  got: dict[str, list] = {}
  hooks = []

  def keep(name, fn=lambda x: x):
    return lambda module, inputs, output: got.setdefault(name, []).append(
      fn(output if not isinstance(output, tuple) else output[0]).detach().numpy()
    )

  heads, head_dim = model.config.num_attention_heads, 0
  head_dim = model.config.hidden_size // heads
  split = lambda x: x.reshape(x.shape[0], x.shape[1], heads, head_dim)

  def keep_input(name):
    return lambda module, inputs: got.setdefault(name, []).append(inputs[0].detach().numpy())

  for layer in model.encoder.layer:
    a = layer.attention
    hooks.append(layer.register_forward_pre_hook(keep_input("attn_in")))
    hooks.append(a.output.LayerNorm.register_forward_pre_hook(keep_input("resid_mid")))
    hooks.append(layer.intermediate.register_forward_pre_hook(keep_input("ffn_in")))
    hooks.append(layer.output.LayerNorm.register_forward_pre_hook(keep_input("resid_out")))
    for site, module in (("q", a.self.query), ("k", a.self.key), ("v", a.self.value)):
      hooks.append(module.register_forward_hook(keep(site, split)))
    hooks.append(
      a.output.dense.register_forward_pre_hook(
        lambda m, inputs: got.setdefault("head_out", []).append(split(inputs[0]).detach().numpy())
      )
    )
    hooks.append(a.output.dense.register_forward_hook(keep("attn_out")))
    hooks.append(a.output.LayerNorm.register_forward_hook(keep("mid")))
    hooks.append(layer.intermediate.register_forward_hook(keep("ffn_act")))
    hooks.append(layer.output.dense.register_forward_hook(keep("ffn_out")))
    hooks.append(layer.output.register_forward_hook(keep("out")))
  hooks.append(model.embeddings.register_forward_hook(keep("embeddings")))
  with torch.no_grad():
    out = model(
      input_ids=torch.tensor(batch.input_ids).long(),
      attention_mask=torch.tensor(batch.attention_mask).long(),
      token_type_ids=torch.tensor(batch.token_type_ids).long(),
      output_attentions=True,
    )
  for h in hooks:
    h.remove()
  sites = {k: np.stack(v) for k, v in got.items()}
  sites["embeddings"] = sites["embeddings"][0]
  sites["probs"] = np.stack([a.numpy() for a in out.attentions])
  return sites, out.last_hidden_state.numpy()


@pytest.fixture(scope="module")
def minilm(minilm_dir):
  pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  config, params = bertjax.from_hf(minilm_dir)
  tok = bertjax.Tokenizer.from_pretrained(minilm_dir)
  model = transformers.BertModel.from_pretrained(str(minilm_dir), attn_implementation="eager")
  return config, params, tok, model.eval()


@pytest.mark.hf
def test_every_site_equals_pytorch_hooks(minilm):
  config, params, tok, model = minilm
  batch = tok.encode(SENTENCES_A)
  theirs, _ = _torch_sites(model, batch)
  sites = bertjax.model_sites(config)
  out = bertjax.forward(
    params, config, batch.input_ids, batch.attention_mask, batch.token_type_ids, capture=sites
  )
  real = batch.attention_mask.astype(bool)
  assert set(out.cache) == set(sites) == set(theirs)  # every site of a BERT block, hooked
  for site, want in theirs.items():
    got = np.asarray(out.cache[site])
    assert got.shape == bertjax.site_shape(config, site, *batch.input_ids.shape), site
    if site == "probs":  # real query rows and real keys: (L, B, N, Tq, Tk)
      rows = np.moveaxis(got, 2, 3)[:, real]
      want_rows = np.moveaxis(want, 2, 3)[:, real]
      diff = np.abs(rows - want_rows).max()
    elif site == "embeddings":
      diff = np.abs(got[real] - want[real]).max()
    else:
      diff = np.abs(got[:, real] - want[:, real]).max()
    assert diff < 1e-5 * max(1.0, float(np.abs(want).max())), (site, diff)


@pytest.mark.hf
def test_head_out_patch_equals_pytorch_hook_edit(minilm):
  import torch

  config, params, tok, model = minilm
  a = tok.encode(SENTENCES_A, pad_to=14)
  b = tok.encode(SENTENCES_B, pad_to=14)
  run_b = bertjax.forward(
    params, config, b.input_ids, b.attention_mask, b.token_type_ids, capture=("head_out",)
  )
  chosen = {(1, 3), (1, 7), (4, 0)}
  # Positions real in both runs (a padded query's context is defined differently here).
  both = (a.attention_mask * b.attention_mask).astype(np.float32)  # (B, T)
  weight = np.zeros((config.depth, *both.shape, config.num_attention_heads, 1), np.float32)
  for layer, head in chosen:
    weight[layer, ..., head, 0] = both
  ours = bertjax.forward(
    params,
    config,
    a.input_ids,
    a.attention_mask,
    a.token_type_ids,
    patch={"head_out": (run_b.cache["head_out"], weight)},
  ).last_hidden_state

  theirs_b, _ = _torch_sites(model, b)
  d = config.head_dim

  def edit(layer):
    def pre_hook(module, inputs):
      x = inputs[0].clone()
      keep = torch.tensor(both)[..., None]
      for l_, h in chosen:
        if l_ == layer:
          patched = torch.tensor(
            theirs_b["head_out"][layer].reshape(x.shape)[..., h * d : (h + 1) * d]
          )
          x[..., h * d : (h + 1) * d] = keep * patched + (1 - keep) * x[..., h * d : (h + 1) * d]
      return (x,)

    return pre_hook

  hooks = [
    model.encoder.layer[i].attention.output.dense.register_forward_pre_hook(edit(i))
    for i in range(config.depth)
  ]
  try:
    with torch.no_grad():
      want = model(
        input_ids=torch.tensor(a.input_ids).long(),
        attention_mask=torch.tensor(a.attention_mask).long(),
        token_type_ids=torch.tensor(a.token_type_ids).long(),
      ).last_hidden_state.numpy()
  finally:
    for h in hooks:
      h.remove()
  real = a.attention_mask.astype(bool)
  clean = bertjax.forward(params, config, a.input_ids, a.attention_mask).last_hidden_state
  assert np.abs(np.asarray(clean)[real] - want[real]).max() > 1e-2  # the edit matters
  assert np.abs(np.asarray(ours)[real] - want[real]).max() < 1e-5


def _tiny():
  config = bertjax.BertConfig.preset("tiny", num_hidden_layers=3)
  params = bertjax.init(config, 3)
  rng = np.random.default_rng(0)
  ids = rng.integers(5, config.vocab_size, (2, 9)).astype(np.int32)
  mask = np.ones((2, 9), np.int32)
  mask[1, 6:] = 0
  return config, params, ids, mask


@pytest.mark.parametrize("site", bertjax.model_sites(bertjax.BertConfig()))
def test_weight_zero_is_bitwise_and_weight_one_replaces(site):
  config, params, ids, mask = _tiny()
  base = bertjax.forward(params, config, ids, mask, capture=(site,))
  value = jax.random.normal(jax.random.key(1), base.cache[site].shape)
  # Against the plain forward (no capture); `probs` needs the map path, so its plain run is
  # the one that returns the maps.
  plain = bertjax.forward(params, config, ids, mask, output_attentions=site == "probs")
  zero = bertjax.forward(params, config, ids, mask, patch={site: (value, 0.0)})
  assert np.array_equal(np.asarray(zero.last_hidden_state), np.asarray(plain.last_hidden_state))
  one = bertjax.forward(params, config, ids, mask, patch={site: (value, 1.0)}, capture=(site,))
  np.testing.assert_allclose(one.cache[site], value, atol=1e-6)
  assert np.abs(np.asarray(one.last_hidden_state - base.last_hidden_state)).max() > 1e-3


def test_patch_weight_gradient_matches_finite_differences():
  config, params, ids, mask = _tiny()
  with jax.enable_x64(True):
    c64 = config.replace(dtype="float64")
    p64 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), params)
    value = bertjax.forward(p64, c64, ids[::-1].copy(), mask, capture=("head_out", "mid")).cache
    probe = jax.random.normal(jax.random.key(2), (2, 9, config.hidden_size), jnp.float64)

    def f(w_heads, w_mid):
      out = bertjax.forward(
        p64,
        c64,
        ids,
        mask,
        patch={
          "head_out": (value["head_out"], w_heads[:, None, None, :, None]),
          "mid": (value["mid"], w_mid[:, None, None, None]),
        },
      )
      return jnp.sum(out.last_hidden_state * probe)

    w_heads = jnp.full((config.depth, config.num_attention_heads), 0.3, jnp.float64)
    w_mid = jnp.asarray([0.1, 0.0, 0.2], jnp.float64)
    grads = jax.grad(f, argnums=(0, 1))(w_heads, w_mid)
    f_jit = jax.jit(f)
    for g, arg, which in ((grads[0], w_heads, 0), (grads[1], w_mid, 1)):
      fd = np.zeros(arg.shape)
      for idx in np.ndindex(arg.shape):
        e = jnp.zeros(arg.shape, jnp.float64).at[idx].set(1e-5)
        args = [w_heads, w_mid]
        lo, hi = list(args), list(args)
        lo[which], hi[which] = arg - e, arg + e
        fd[idx] = (float(f_jit(*hi)) - float(f_jit(*lo))) / 2e-5
      assert np.abs(fd).max() > 1e-3
      np.testing.assert_allclose(np.asarray(g), fd, rtol=1e-6, atol=1e-9)


def test_patch_sweep_vmaps_and_matches_a_loop():
  config, params, ids, mask = _tiny()
  value = bertjax.forward(params, config, ids[::-1].copy(), mask, capture=("head_out",)).cache
  n = config.depth * config.num_attention_heads
  weights = np.eye(n, dtype=np.float32).reshape(
    n, config.depth, 1, 1, config.num_attention_heads, 1
  )

  def run(w):
    return bertjax.forward(
      params, config, ids, mask, patch={"head_out": (value["head_out"], w)}
    ).last_hidden_state[:, 0]

  swept = jax.jit(jax.vmap(run))(jnp.asarray(weights))
  for i in (0, 5, n - 1):
    np.testing.assert_allclose(swept[i], run(weights[i]), atol=1e-5)


def test_patch_with_prefix_reuse_and_pruned_model():
  config, params, ids, mask = _tiny()
  full = bertjax.forward(params, config, ids, mask, capture=("out", "ffn_act"))
  value = jnp.zeros_like(full.cache["ffn_act"])
  weight = np.zeros((config.depth, 1, 1, 1), np.float32)
  weight[2] = 0.5
  want = bertjax.forward(params, config, ids, mask, patch={"ffn_act": (value, weight)})
  start = full.cache["out"][1]  # the input of block 2
  got = bertjax.run_layers(
    params, config, start, mask, start=2, patch={"ffn_act": (value, weight)}, capture=("out",)
  )
  np.testing.assert_allclose(got.last, want.last_hidden_state, atol=1e-6)
  assert got.cache["out"].shape[0] == 1
  # A pruned model: captured head sites keep the original head indexing (zeros removed).
  pruned_config, pruned = bertjax.prune_heads(config, params, {1: [0, 2]})
  hm = np.ones((config.depth, config.num_attention_heads), np.float32)
  hm[1, [0, 2]] = 0
  masked = bertjax.forward(params, config, ids, mask, head_mask=hm, capture=("head_out",))
  out = bertjax.forward(pruned, pruned_config, ids, mask, capture=("head_out", "probs"))
  np.testing.assert_allclose(out.cache["head_out"], masked.cache["head_out"], atol=1e-5)
  np.testing.assert_allclose(out.last_hidden_state, masked.last_hidden_state, atol=1e-5)
  assert not np.asarray(out.cache["probs"][1, :, [0, 2]]).any()
  # A block with every head removed captures zeros at its head sites, the first block too.
  for layer in (1, 0):
    bare_config, bare = bertjax.prune_heads(config, params, {layer: list(range(4))})
    out = bertjax.forward(bare, bare_config, ids, mask, capture=("probs", "head_out", "q"))
    for site in ("probs", "head_out", "q"):
      assert out.cache[site].shape == bertjax.site_shape(config, site, *ids.shape), site
      assert not np.asarray(out.cache[site][layer]).any(), (layer, site)
      assert np.asarray(out.cache[site][2]).any()


def test_bad_sites_are_named():
  config, params, ids, mask = _tiny()
  with pytest.raises(ValueError, match=r"sites \['keys'\] are unknown"):
    bertjax.forward(params, config, ids, mask, capture=("keys",))
  with pytest.raises(ValueError, match=r"patch\['mid'\] value shape \(5,\) does not broadcast"):
    bertjax.forward(params, config, ids, mask, patch={"mid": (np.zeros(5), 1.0)})
  with pytest.raises(ValueError, match=r"patch\['q'\] must be a \(value, weight\) pair"):
    bertjax.forward(params, config, ids, mask, patch={"q": np.zeros(4)})
  with pytest.raises(ValueError, match=r"capture entries \[None\] are not site names"):
    bertjax.forward(params, config, ids, mask, capture=("q", None))
  for value, weight, what in ((None, 1.0, "value"), (0.0, "half", "weight")):
    with pytest.raises(ValueError, match=rf"patch\['q'\] {what} must be a number or an array"):
      bertjax.forward(params, config, ids, mask, patch={"q": (value, weight)})
  assert bertjax.forward(params, config, ids, mask, capture=None).cache is None
  # run_layers checks what forward checks; a patch led by the blocks run (not the model's
  # depth) would otherwise be read as constant over depth.
  h1 = bertjax.forward(params, config, ids, mask, output_hidden_states=True).hidden_states[1]
  outs = bertjax.forward(params, config, ids, mask, capture=("out",)).cache["out"]
  with pytest.raises(
    ValueError,
    match=r"value shape \(2, 2, 9, 64\) does not broadcast to the "
    r"site's stacked shape \(3, 2, 9, 64\)",
  ):
    bertjax.run_layers(params, config, h1, mask, start=1, patch={"out": (outs[1:], 1.0)})
  with pytest.raises(ValueError, match=r"sites \['bogus'\] are unknown"):
    bertjax.run_layers(params, config, h1, mask, capture=("bogus",))
  with pytest.raises(ValueError, match="'embeddings' is the hidden state you pass"):
    bertjax.run_layers(params, config, h1, mask, capture=("embeddings",))
  # float64 without 64-bit JAX would silently compute in float32.
  if not jax.config.jax_enable_x64:
    with pytest.raises(ValueError, match="needs 64-bit JAX"):
      bertjax.forward(params, config.replace(dtype="float64"), ids, mask)


def test_patch_values_from_torch_are_accepted():
  torch = pytest.importorskip("torch")
  config, params, ids, mask = _tiny()
  value = np.random.default_rng(2).normal(size=(config.depth, 2, 9, 4, 16)).astype(np.float32)
  want = bertjax.forward(params, config, ids, mask, patch={"q": (value, 0.5)})
  got = bertjax.forward(
    params, config, ids, mask, patch={"q": (torch.from_numpy(value), torch.tensor(0.5))}
  )
  np.testing.assert_array_equal(got.last_hidden_state, want.last_hidden_state)
  x = bertjax.embed(params, config, ids)
  got = bertjax.run_layers(params, config, x, mask, patch={"q": (torch.from_numpy(value), 0.5)})
  np.testing.assert_allclose(got.last, want.last_hidden_state, atol=1e-6)
  with pytest.raises(ValueError, match=r"patch\['q'\] value cannot be read as an array"):
    bertjax.forward(
      params, config, ids, mask, patch={"q": (torch.from_numpy(value).requires_grad_(), 0.5)}
    )


def test_forward_under_jit_with_static_argnames():
  """The README's jit recipe: config and program-shaping flags static, patches traced."""
  config, params, ids, mask = _tiny()
  jitted = jax.jit(
    bertjax.forward,
    static_argnames=(
      "config",
      "head_ablation",
      "output_hidden_states",
      "output_attentions",
      "capture",
      "deterministic",
    ),
  )
  hm = np.ones((config.depth, config.num_attention_heads), np.float32)
  got = jitted(
    params,
    config,
    ids,
    mask,
    head_mask=hm,
    head_ablation="uniform",
    output_attentions=True,
    capture=("mid",),
  )
  want = bertjax.forward(
    params,
    config,
    ids,
    mask,
    head_mask=hm,
    head_ablation="uniform",
    output_attentions=True,
    capture=("mid",),
  )
  np.testing.assert_allclose(got.cache["mid"], want.cache["mid"], atol=1e-6)
  assert got.attentions.shape == want.attentions.shape


def _final_rows_case(config, params, ids, mask, rows, **kwargs):
  """(full, restricted) `run_layers` outputs with every site captured and maps on."""
  x = bertjax.embed(params, config, ids)
  kw = dict(capture=block_sites(config), output_hidden_states=True, **kwargs)
  return (
    bertjax.run_layers(params, config, x, mask, **kw),
    bertjax.run_layers(params, config, x, mask, final_rows=rows, **kw),
  )


@pytest.mark.parametrize("variant", ["bert", "albert", "pruned", "maps", "pallas"])
def test_final_rows_equal_the_full_block_at_those_rows(variant):
  """The last block run at chosen rows gives the full block's values there (every site,
  hidden states, maps; padded and repeated rows included) and zeros at the other rows;
  earlier blocks are untouched."""
  config, params, ids, mask = _tiny()
  kwargs = {}
  if variant == "albert":
    config = bertjax.BertConfig.preset(
      "tiny", model_type="albert", embedding_size=32, num_hidden_layers=3
    )  # one shared group
    params = bertjax.init(config, 1)
  elif variant == "pruned":
    config, params = bertjax.prune_heads(config, params, {2: [1], 0: [0, 3]})
  elif variant == "maps":
    kwargs["output_attentions"] = True
  elif variant == "pallas":  # equal q and k lengths only: the block runs in full, then masked
    config = config.replace(attention_impl="pallas")
  rows = jnp.asarray([[4, 0, 4], [8, 2, 5]])  # ids[1] is padded from 6 on: row 8 is padding
  full, part = _final_rows_case(config, params, ids, mask, rows, **kwargs)
  keep = np.zeros(ids.shape, bool)
  keep[np.arange(2)[:, None], np.asarray(rows)] = True
  close = lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-6)
  close(take_rows(full.last, rows), take_rows(part.last, rows))
  assert not np.asarray(part.last)[~keep].any()
  close(full.hidden_states[:-1], part.hidden_states[:-1])
  for site in block_sites(config):
    f, p = full.cache[site], part.cache[site]
    close(f[:-1], p[:-1])
    axis = ROW_AXIS.get(site)
    if axis is None:  # keys and values: every position
      close(f[-1], p[-1])
      continue
    close(take_rows(f[-1], rows, axis), take_rows(p[-1], rows, axis))
    rest = np.moveaxis(np.asarray(p[-1]), axis, 1)[~keep]
    assert not rest.any(), site
  if variant == "maps":
    close(take_rows(full.attentions[-1], rows, 2), take_rows(part.attentions[-1], rows, 2))
  assert np.abs(np.asarray(full.last)[keep]).max() > 0.1


def test_final_rows_patches_and_gradients_match_the_full_block():
  """A patched last block at chosen rows: same metric, same gradient w.r.t. the weights."""
  config, params, ids, mask = _tiny()
  x = bertjax.embed(params, config, ids)
  value = bertjax.forward(
    params, config, ids[::-1].copy(), mask, capture=("head_out", "ffn_act")
  ).cache
  rows = jnp.asarray([[4], [2]])
  probe = jax.random.normal(jax.random.key(3), (config.hidden_size,))

  def metric(w, final_rows):
    out = bertjax.run_layers(
      params,
      config,
      x,
      mask,
      final_rows=final_rows,
      patch={
        "head_out": (value["head_out"], w[:, None, None, :, None]),
        "ffn_act": (value["ffn_act"], w[:, :1, None, None]),
      },
    )
    return jnp.sum(take(out.last) @ probe)

  take = lambda h: h[jnp.arange(2)[:, None], rows]
  w = jax.random.uniform(jax.random.key(4), (config.depth, config.num_attention_heads))
  value_and_grad = jax.jit(jax.value_and_grad(metric))  # a program, not one per operation
  (m_rows, g_rows), (m_full, g_full) = value_and_grad(w, rows), value_and_grad(w, None)
  np.testing.assert_allclose(m_rows, m_full, atol=1e-5)
  assert np.abs(np.asarray(g_full)).max() > 1e-3
  np.testing.assert_allclose(g_rows, g_full, atol=1e-5)
  with pytest.raises(ValueError, match=r"final_rows shape \(3, 1\) must be \(batch=2, R\)"):
    bertjax.run_layers(params, config, x, mask, final_rows=jnp.zeros((3, 1), jnp.int32))


@pytest.mark.parametrize("model_type", ["bert", "albert"])
def test_unrolled_blocks_equal_the_scan(model_type):
  """`run_layers(unroll=True)`: the same blocks in a Python loop, same outputs, captures,
  maps and gradients as the scan (a part of the stack too)."""
  config, params, ids, mask = _tiny()
  if model_type == "albert":
    config = bertjax.BertConfig.preset(
      "tiny", model_type="albert", embedding_size=32, num_hidden_layers=3
    )
    params = bertjax.init(config, 1)
  x = bertjax.embed(params, config, ids)
  kw = dict(capture=("head_out", "ffn_act"), output_hidden_states=True, output_attentions=True)
  for start in (0, 1):
    a = bertjax.run_layers(params, config, x, mask, start=start, **kw)
    b = bertjax.run_layers(params, config, x, mask, start=start, unroll=True, **kw)
    for got, want in zip(jax.tree.leaves(b), jax.tree.leaves(a)):
      np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6)
  value = jax.random.normal(jax.random.key(5), (config.depth, 2, 9, 4, config.head_dim))

  def metric(w, unroll):
    out = bertjax.run_layers(
      params, config, x, mask, unroll=unroll, patch={"head_out": (value, w[:, None, None, :, None])}
    )
    return jnp.sum(out.last[:, 0] ** 2)

  w = jnp.full((config.depth, config.num_attention_heads), 0.2)
  np.testing.assert_allclose(jax.grad(metric)(w, True), jax.grad(metric)(w, False), atol=1e-5)


def _zero_head_3_of_layer_2(value, layer):
  """A function patch: head 3 of layer 2 (index 1) set to zero, every other head kept."""
  return jnp.where(layer == 1, value.at[..., 3, :].set(0.0), value)


def test_a_function_patch_is_a_traced_edit():
  """patch={site: fn} applies fn(value, index) in every block, equal to the same edit as a
  head mask; it composes with jit, vmap and grad; a wrong shape is named."""
  config, params, ids, mask = _tiny()
  xi = np.ones((config.depth, config.num_attention_heads), np.float32)
  xi[1, 3] = 0.0
  want = bertjax.forward(params, config, ids, mask, head_mask=xi).last_hidden_state
  got = bertjax.forward(
    params, config, ids, mask, patch={"head_out": _zero_head_3_of_layer_2}
  ).last_hidden_state
  np.testing.assert_allclose(got, want, atol=1e-6)
  assert (
    np.abs(
      np.asarray(got) - np.asarray(bertjax.forward(params, config, ids, mask).last_hidden_state)
    ).max()
    > 1e-3
  )
  # Under the caller's jit and vmap (over sequences), and differentiated.
  run = jax.jit(
    lambda i, m: (
      bertjax.forward(
        params, config, i, m, patch={"head_out": _zero_head_3_of_layer_2}
      ).last_hidden_state
    )
  )
  np.testing.assert_allclose(run(ids, mask), want, atol=1e-6)
  per_row = jax.vmap(lambda i, m: run(i[None], m[None])[0])(ids, mask)
  np.testing.assert_allclose(per_row, want, atol=1e-5)
  emb = bertjax.embed(params, config, ids)
  grad = jax.grad(
    lambda x: bertjax.run_layers(
      params, config, x, mask, patch={"head_out": _zero_head_3_of_layer_2}
    ).last.sum()
  )(emb)
  assert np.isfinite(np.asarray(grad)).all()
  with pytest.raises(ValueError, match=r"patch\['mid'\] function returned shape"):
    bertjax.forward(params, config, ids, mask, patch={"mid": _first_row_only})


def _first_row_only(value, layer):
  return value[:1]


def _index_as_value(value, index):
  """A function patch whose new value is the block index it receives, everywhere."""
  return jnp.zeros_like(value) + jnp.asarray(index, value.dtype)


def test_a_function_patch_receives_the_0_based_block_index():
  """fn(value, index) gets each block's 0-based index (index i is layer i + 1 in the README's
  numbering), in the scanned and the unrolled loop, and the block's own index when
  `run_layers` starts past block 0; a patch that is neither kind names `fn(value, index)`."""
  config, params, ids, mask = _tiny()
  emb = bertjax.embed(params, config, ids)
  patch = {"ffn_out": _index_as_value}
  for unroll in (False, True):
    for start in (0, 1):
      hidden = emb if start == 0 else bertjax.run_layers(params, config, emb, mask, stop=1).last
      got = bertjax.run_layers(
        params, config, hidden, mask, start=start, capture=("ffn_out",), patch=patch, unroll=unroll
      ).cache["ffn_out"]
      want = np.arange(start, config.depth, dtype=np.float32)[:, None, None, None]
      np.testing.assert_array_equal(got, np.broadcast_to(want, got.shape), f"{unroll=} {start=}")
  with pytest.raises(ValueError, match=r"patch\['mid'\] must be .* a function fn\(value, index\)"):
    bertjax.forward(params, config, ids, mask, patch={"mid": 0.5})

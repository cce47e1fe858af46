# %% [markdown]
# # Activation patching and attribution on negation
#
# Which of MiniLM's 72 heads carry negation, and which input token does each attribution
# method credit for it? This tutorial asks both questions of the real all-MiniLM-L6-v2 with
# bertjax's named sites: it fits a linear probe that reads negation from the sentence
# embedding, patches each head's output from a negated sentence into its affirmative twin,
# first by hand and then as one compiled sweep, checks the gradient estimate (attribution
# patching, Nanda 2023; Syed et al. 2023) against the exact patches, and ranks the negation
# cue under seven token-attribution methods. It uses only what ships with bertjax and runs
# in about a minute on a laptop CPU.

# %%
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import bertjax
from bertjax.analysis.interventions import metrics, patching
from bertjax.tasks import negation
from bertjax.tasks.sentences import load_sentences

path = bertjax.minilm_path()
config, params = bertjax.from_hf(path)
tok = bertjax.Tokenizer.from_pretrained(path)
sentences = load_sentences()

# %% [markdown]
# ## A probe that reads negation
#
# Every one of the project's 385 sentences is labelled negated or not. The probe is a
# logistic regression on the mean-pooled final states (the sentence embedding MiniLM is
# used through), fitted on the even-numbered sentences and scored on the odd ones.

# %%
features, labels = negation.pooled_features(params, config, tok, sentences)
train, test = np.arange(0, len(labels), 2), np.arange(1, len(labels), 2)
w, b, mu, sd = negation.fit_probe(features[train], labels[train])
weight, bias = negation.probe_weights(w, b, mu, sd)  # (hidden, 2), (2,): class 1 is "negated"
predicted = (features[test] @ weight + bias).argmax(1)
majority = max(labels[test].mean(), 1 - labels[test].mean())
print(f"held-out accuracy {np.mean(predicted == labels[test]):.3f} (majority class {majority:.3f})")

# %% [markdown]
# ## Clean and corrupted runs
#
# Patching needs pairs that differ only where the question lies. `negation.pairs` turns each
# negated sentence into its same-length affirmative twin ("not" -> "also", "never" ->
# "often", "n't" -> "'s", ...), so both runs have the same tokens and padding but the cue.
# The metric is the probe's logit difference, negated minus affirmative, averaged over pairs.

# %%
negated = [s.text for s in sentences if s.negated][:32]
clean, corrupted, kept = negation.pairs(tok, negated)
n = len(kept)
row = clean.attention_mask[0].astype(bool)
print(" ".join(tok.convert_ids_to_tokens(clean.input_ids[0][row])))
print(" ".join(tok.convert_ids_to_tokens(corrupted.input_ids[0][row])))

metric = metrics.ProbeLogitDiff(weight, bias, pooling="mean")
targets = {"answer": np.ones(n, np.int32), "distractor": np.zeros(n, np.int32)}


def probe_logit(batch, **kwargs):
  out = bertjax.forward(params, config, batch.input_ids, batch.attention_mask, **kwargs)
  return float(
    metric(params, config, out, {"attention_mask": jnp.asarray(batch.attention_mask), **targets})
  )


print(
  f"{n} pairs: logit difference {probe_logit(clean):.2f} negated, {probe_logit(corrupted):.2f} twins"
)

# %% [markdown]
# ## One patch by hand
#
# `head_out` is each head's context vector, (depth, batch, seq, heads, head_dim) when
# captured. A patch is data: the site becomes `weight * value + (1 - weight) * own`, so a
# weight of one at (layer, head) and zero elsewhere puts that head's clean output into the
# corrupted run. Layer 6 is index 5; head 9 of layer 6 is the one the sweep below ranks
# first.

# %%
captured = bertjax.forward(
  params, config, clean.input_ids, clean.attention_mask, capture=("head_out",)
)
cache = captured.cache["head_out"]


def patch_one(layer, head):
  weight = jnp.zeros((config.depth, 1, 1, config.num_attention_heads, 1))
  weight = weight.at[layer - 1, ..., head, :].set(1.0)
  return probe_logit(corrupted, patch={"head_out": (cache, weight)})


by_hand = patch_one(6, 9)
print(f"layer 6, head 9 patched: {by_hand:.3f}")

# %% [markdown]
# ## Every head at once, exact and by gradient
#
# `patching.head_patching` does the same for all 72 heads in one compiled program (a vmap
# over patch weights); `patching.attribution_patching` estimates all 72 from one forward
# and one backward pass, the first-order term of the same patch. Both are reported as the
# share of the clean-minus-corrupted logit restored: 1 is the clean run, 0 the corrupted.

# %%
exact = patching.head_patching(params, config, clean, corrupted, metric, targets=targets)
approx = patching.attribution_patching(params, config, clean, corrupted, metric, targets=targets)
assert abs(exact.values[5, 9] - by_hand) < 1e-3 * max(
  1.0, abs(by_hand)
)  # the sweep is the hand patch
agree = metrics.agreement(exact, approx)
print(
  f"exact against attribution patching: Pearson {agree['pearson']:.2f}, Spearman {agree['spearman']:.2f}"
)
top = np.dstack(
  np.unravel_index(np.argsort(-exact.normalized, axis=None)[:5], exact.normalized.shape)
)[0]
for layer, head in top:
  print(
    f"layer {layer + 1} head {head:2d}: restores {exact.normalized[layer, head]:+.2f} "
    f"(gradient estimate {approx.normalized[layer, head]:+.2f})"
  )

# %%
lim = np.abs(np.concatenate([exact.normalized, approx.normalized])).max()
fig, axes = plt.subplots(1, 2, figsize=(11, 3.4))
for ax, values, title in (
  (axes[0], exact.normalized, "exact patching"),
  (axes[1], approx.normalized, "attribution patching"),
):
  im = ax.imshow(values, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
  ax.set(
    title=title,
    xlabel="head",
    ylabel="layer",
    yticks=range(config.depth),
    yticklabels=range(1, config.depth + 1),
  )
fig.colorbar(im, ax=axes, label="share of the negation logit restored")
plt.show()

# %% [markdown]
# ## Which token does each method credit?
#
# The same probe is the target of token attribution. For each negated sentence, each method
# scores every input token for the probe's negation logit, and we ask where it ranks the cue
# ("not", "never", "n't", ...): top-1 rate and mean reciprocal rank (MRR), against picking
# a token at random. Context-mixing methods (attention, rollout, ALTI) explain where
# information flows; gradient and relevance methods (gradient x input, integrated
# gradients, AttnLRP, DecompX) explain the logit itself; the table says which of them find
# the cue.

# %%
methods = (
  "attention",
  "rollout",
  "alti",
  "grad_x_input",
  "integrated_gradients",
  "attnlrp",
  "decompx",
)
cues = negation.cue_statistics(
  params, config, tok, negated, (weight, bias), methods=methods, ig_steps=16
)
print(
  f"{len(cues['sentences'])} sentences; chance: top-1 {cues['chance']['top1']:.2f}, MRR {cues['chance']['mrr']:.2f}"
)
for method in methods:
  s = cues["stats"][method]
  print(f"{method:>22}: top-1 {s['top1']:.2f}, MRR {s['mrr']:.2f}, mean rank {s['mean_rank']:.1f}")

# %% [markdown]
# ## Where to go next
#
# - `./run.sh experiment attribution` ranks the cue under all eleven methods (with
#   attention flow, GlobEnc and value zeroing) on more sentences, with bootstrap intervals.
# - `./run.sh experiment negation_circuit` goes from heads to edges: EAP and EAP-IG scores
#   for every edge of the graph, exact edge patching to check them, and the smallest
#   faithful circuit.
# - The [manual](../manual.md#activation-patching-bertjaxanalysisinterventionspatchingpy)
#   covers position patching, path patching, meshes and the metrics.

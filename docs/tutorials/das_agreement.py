# %% [markdown]
# # Where the subject's number lives: a DAS search and a steering sweep
#
# MiniLM's sentence embedding tells a singular subject from a plural one. In which layer,
# and along which direction of the residual stream at the subject's token, is that number
# carried? This tutorial asks the real all-MiniLM-L6-v2 with distributed alignment search
# (DAS, Geiger et al. 2024): at every layer it learns the one direction whose value, moved
# from a sentence with a subject of the other number, flips a number probe's reading, and
# scores it by interchange-intervention accuracy (IIA) on held-out pairs. Then it steers
# along the direction found. It uses only what ships with bertjax and runs in about a minute
# on a laptop CPU.

# %%
import dataclasses

import matplotlib.pyplot as plt
import numpy as np

import bertjax
from bertjax import stats
from bertjax.analysis.causal import interchange as ci
from bertjax.analysis.causal import localisation
from bertjax.tasks import agreement, negation

path = bertjax.minilm_path()
config, params = bertjax.from_hf(path)
tok = bertjax.Tokenizer.from_pretrained(path)

# %% [markdown]
# ## Counterfactual pairs and a probe that reads the number
#
# `agreement_pairs` builds sentences such as "the author near the pilots [MASK] here .":
# base and source differ only in the subject, of opposite number, and the pair's label is the
# source's number (1: plural). MiniLM ships no MLM head, so the number is read by a logistic
# probe on the mean-pooled final states (the embedding MiniLM is used through), fitted on
# the first 128 pairs' sentences; `with_probe` makes it the readout of every run below.

# %%
task = agreement.agreement_pairs(tok, 384, seed=0)
pairs = dataclasses.replace(task.pairs, candidates=np.arange(2))  # the probe's two classes


def pooled(ids):
  out = bertjax.forward(params, config, ids, pairs.attention_mask)
  return stats.mean_pool(np.asarray(out.last_hidden_state, np.float64), pairs.attention_mask)


fit_rows = np.arange(128)
features = np.concatenate([pooled(pairs.base_ids)[fit_rows], pooled(pairs.source_ids)[fit_rows]])
numbers = np.concatenate([task.base_label[fit_rows], pairs.label[fit_rows]])
weight, bias = negation.probe_weights(*negation.fit_probe(features, numbers))
probed = ci.with_probe(params, weight, bias)
base_answer, source_answer = ci.answers(probed, config, pairs)
right = (base_answer == task.base_label) & (source_answer == pairs.label)
print(
  f"the probe reads the number right on both sentences of {right[128:].mean():.2f} of the other pairs"
)

# %% [markdown]
# ## DAS at every layer
#
# Of the pairs the probe reads right on both sentences (as the interpretability benchmark
# MIB keeps them), 48 train and the rest are held out. `layer_search` trains a one-dimensional
# rotation at the residual stream after each block (`out`), at the subject's token, for 30
# full-batch Adam steps, each layer from its block's input; the full vector (every
# coordinate moved) is the baseline.

# %%
keep = np.flatnonzero(right[128:]) + 128
train, held = pairs.take(keep[:48]), pairs.take(keep[48:])
fits = ci.layer_search(probed, config, train, held, "out", k=1, steps=30)
full = localisation.correctness(probed, config, train, held, "out", methods=("full",))["full"]
full = full.mean(1)  # each layer's IIA: the share of held-out pairs it gets right
for f, v in zip(fits, full):
  print(f"layer {f.layer + 1}: DAS (one direction) IIA {f.heldout_iia:.2f}, full vector {v:.2f}")

# %% [markdown]
# The layers are counted from 1 (the output of block 1). Where one direction scores close to
# the full vector, the number is carried along it at the subject's token; where even the full
# vector scores low, later blocks have already copied the number to other tokens, and moving
# the subject's state alone no longer decides the reading. At the last layer an interchange
# moves only the subject's share of the mean-pooled embedding; there one direction can score
# above the full vector, since an interchange along a direction between the source-minus-base
# difference and the probe's weights moves the probe's reading more than the whole difference
# does.

# %%
best = max(fits, key=lambda f: f.heldout_iia)
direction = best.basis[0]
strengths = np.linspace(-12, 12, 13)
steered = np.asarray(ci.steer(probed, config, held, "out", best.layer, direction, strengths))
plural_minus_singular = (steered[..., 1] - steered[..., 0]).mean(1)

fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
layers = np.arange(1, config.depth + 1)
axes[0].plot(layers, [f.heldout_iia for f in fits], "o-", label="DAS, one direction")
axes[0].plot(layers, full, "s--", label="full vector")
axes[0].set(
  xlabel="layer", ylabel="held-out IIA", ylim=(0, 1.05), title="interchange at the subject"
)
axes[0].legend()
axes[1].plot(strengths, plural_minus_singular, "o-")
axes[1].axhline(0, color="grey", lw=0.8)
axes[1].set(
  xlabel="strength along the DAS direction",
  ylabel="probe: plural - singular logit",
  title=f"steering at layer {best.layer + 1}",
)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Steering
#
# `steer` adds `strength * direction` (the direction DAS found at the best layer, unit norm)
# at the subject's token and reads the probe, for a sweep of strengths: the same edit as a
# one-row interchange whose source is the run's own value moved along the direction. Where
# the curve crosses zero, the direction carries the number the way the interchange
# said. `experiments/causal_variables.py` runs the same search with DBM, PCA and SAE features
# beside it, on three tasks, with intervals over the pairs.

# %%
print("plural - singular logit by strength:")
print({float(s): round(float(v), 2) for s, v in zip(strengths, plural_minus_singular)})

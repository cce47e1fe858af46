"""Causal variables: interchange interventions on subspaces (DAS, boundless DAS, DBM), PCA
baselines and steering (`bertjax.analysis.causal.interchange`)."""

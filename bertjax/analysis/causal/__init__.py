"""Causal variables: interchange interventions on subspaces (DAS, boundless DAS, DBM), PCA
baselines and steering (`bertjax.analysis.causal.interchange`), and on a sparse autoencoder's
features (`bertjax.analysis.causal.sae_features`)."""

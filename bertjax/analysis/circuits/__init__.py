"""Circuits through learned features: per-layer and cross-layer transcoders
(`bertjax.analysis.circuits.transcoders`) and the replacement model they make
(`bertjax.analysis.circuits.replacement`)."""

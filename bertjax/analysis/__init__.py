"""Analyses: attention statistics and patterns, ablation and pruning, probing, geometry."""

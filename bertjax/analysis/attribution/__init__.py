"""Token attribution and decompositions: attention propagation (rollout, flow, norms,
ALTI, GlobEnc, value zeroing), gradients (gradient x input, integrated gradients, logit
lens), DecompX, AttnLRP/CP-LRP, direct logit attribution and the tuned lens."""

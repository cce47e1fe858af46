"""Interventions and their effects: head and layer ablation and importance, activation
and attribution patching (AtP*), edge attribution and circuits, the metrics they score,
batching and the mesh runners they share."""

"""The research tasks shared by the report and the experiments (negation: cue words,
same-length twins, a fitted probe)."""

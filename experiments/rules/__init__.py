"""The Findings rules, one module per experiment script: each holds the paper's claims as
`bertjax.claims.Claim`s (the claim, the measured quantities, the thresholds) and
`findings(results, settings)`, which makes the Findings rows from a results JSON as written.
A script's run and `findings.py --refresh` both call it, so the rows never depend on a rerun."""

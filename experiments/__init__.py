"""The BERTology literature's experiments, one module per paper: its measurement and its claims.

Each module answers one question and runs as `python -m experiments.NAME` from the checkout
(or `./run.sh experiment NAME` from anywhere). They all:

* take `--out DIR`, `--update-results`, `--seed`, `--smoke` (a tiny model and tiny data:
  what the tests run) and, those that read a data set (all but attribution), `--data-dir
  DIR`; those that analyse a trained model take `--model DIR_OR_ID` too: any Hugging Face
  checkpoint of a family with a tokenizer instead of all-MiniLM-L6-v2;
* write `STEM.json` (every number, the settings, the machine, the time taken, and the
  `findings` rows) and `STEM_*.png` figures into a scratch folder (`out/experiments` under
  the working directory) unless `--update-results` names the committed `experiments/results`
  (never with `--smoke`). STEM is NAME for all-MiniLM-L6-v2 and `NAME_MODEL` for any other
  `--model`, so each (experiment, model) has one result file;
* find the real data sets through `bertjax.data.fetch`: `--data-dir`, else
  `$BERTJAX_DATA_DIR` (or the user cache that `bertjax data fetch` fills), else
  `../shared/data` beside the repository; `--smoke` reads the samples shipped in
  `bertjax/resources/smoke/`;
* end with their claims: `bertjax.claims.Claim`s, `findings(results, settings)` (the rows,
  made from the numbers as the JSON holds them) and `uncertainty(results, settings)` (each
  claim's interval and verdict).

The machinery they share is `bertjax.study`; `common` binds it to this repository's results
folder and `sizes.toml` (the full, smoke and GPU sizes of every run). `findings` turns the
committed JSON files into docs/findings.md and a page per experiment.
"""

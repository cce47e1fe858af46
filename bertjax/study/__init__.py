"""What a study shares: its command line, its model, its sizes, its result file.

A study is one script answering one question (each module of the repository's `experiments/`
package is one). With these pieces it:

* takes `--out DIR`, `--update-results`, `--seed`, `--smoke` (a tiny model on the samples
  shipped in `bertjax/resources/smoke/`, for tests) and, where it reads a data set or
  analyses a trained model, `--data-dir DIR` and `--model DIR_OR_ID` (`parser`, `load_model`);
* writes `STEM.json`: every number, the settings, the machine, the time taken, and the rows
  its `bertjax.claims.Claim`s make from the numbers as written (`finish`, `write_results`),
  into a scratch folder unless `--update-results` names the committed one; STEM is the
  study's name, with the model's tag for any model but all-MiniLM-L6-v2 (`results_stem`);
* reads its sizes, full and smoke, from a TOML file (`sizes`), and sizes a training run with
  a `Scale` or a `PretrainScale`;
* compiles a `--smoke` run quickly (`quick_compiles`, `smoke_compilation_cache`);
* prints progress lines to stderr (`log`, `timed`); a `UsageError` or a missing data set
  prints one line, with no traceback.

A new study in a few lines:

    import time
    from bertjax import study
    from bertjax.claims import Claim, Test

    CLAIM = Claim("Me 2026", "Most heads attend to [CLS].", yes=(Test("share", ">=", 0.5),))

    def findings(results, settings):
      return [CLAIM.row(f"{results['share']:.2f} of heads", {"share": results["share"]})]

    def main(argv=None):
      args = study.parser(__doc__, results="results").parse_args(argv)
      start, (config, params, tok, name) = time.perf_counter(), study.load_model(args)
      results = {"share": ...}  # measured
      study.finish("mine", args, results, {"model": name}, findings=findings, started=start)
"""

from bertjax.study.command import (
  DEFAULT_MODEL,
  MODEL_FAMILIES,
  MPNET,
  SCRATCH,
  UsageError,
  log,
  parser,
  timed,
)
from bertjax.study.inputs import (
  data_dir,
  head_source,
  load_wikitext,
  masked_windows,
  smoke_data_dir,
  ud_file,
  wikitext_windows,
  with_mlm_head,
)
from bertjax.study.models import (
  SMOKE_MODEL,
  describe_model,
  finetune_model,
  load_model,
  minilm,
  pretrained,
  special_tokens,
  tiny_model,
  tiny_stand_in,
)
from bertjax.study.results import (
  HOLDS,
  finish,
  from_json,
  machine,
  model_tag,
  results_stem,
  to_json,
  write_results,
)
from bertjax.study.runtime import (
  SMOKE_XLA_FLAG,
  one_blas_thread,
  quick_compiles,
  smoke_cached,
  smoke_compilation_cache,
)
from bertjax.study.sizes import PretrainScale, Scale, sizes

__all__ = [
  "DEFAULT_MODEL",
  "HOLDS",
  "MODEL_FAMILIES",
  "MPNET",
  "SCRATCH",
  "SMOKE_MODEL",
  "SMOKE_XLA_FLAG",
  "PretrainScale",
  "Scale",
  "UsageError",
  "data_dir",
  "describe_model",
  "finetune_model",
  "finish",
  "from_json",
  "head_source",
  "load_model",
  "load_wikitext",
  "log",
  "machine",
  "masked_windows",
  "minilm",
  "model_tag",
  "one_blas_thread",
  "parser",
  "pretrained",
  "quick_compiles",
  "results_stem",
  "sizes",
  "smoke_cached",
  "smoke_compilation_cache",
  "smoke_data_dir",
  "special_tokens",
  "timed",
  "tiny_model",
  "tiny_stand_in",
  "to_json",
  "ud_file",
  "wikitext_windows",
  "with_mlm_head",
  "write_results",
]

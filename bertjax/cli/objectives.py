"""`bertjax pretrain`'s other objectives: SBO, word order, ELECTRA/DeBERTa RTD, distillation.

`add_args` adds the option group; `setup` turns the parsed options into the model
config, initial parameters, data iterator and objectives that `loop.pretrain` takes.
With none of these options given, `setup` returns the plain iterator and the data's
own objective (MLM + NSP/SOP), so runs without them are unchanged.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_args(p: argparse.ArgumentParser) -> None:
  """The "more objectives" option group."""
  g = p.add_argument_group("more objectives")
  g.add_argument(
    "--add-objective",
    action="append",
    default=None,
    choices=("sbo", "word_order"),
    help="add SpanBERT's span boundary objective (needs --masking span) or "
    "StructBERT's word-order objective; repeatable",
  )
  g.add_argument(
    "--word-order-prob",
    type=float,
    default=0.05,
    metavar="P",
    help="fraction of tokens in shuffled trigrams (word_order)",
  )
  g.add_argument(
    "--electra-generator-size",
    type=float,
    default=None,
    metavar="F",
    help="train ELECTRA: the --preset/--config-json model (model_type electra) is "
    "the discriminator; the generator has F times its hidden size, heads "
    "and FFN (the paper: 0.25-0.5); loss MLM + 50 x RTD; --export-hf DIR "
    "writes DIR/generator and DIR/discriminator",
  )
  g.add_argument(
    "--rtd-generator-layers",
    type=int,
    default=None,
    metavar="N",
    help="train DeBERTa-v3's replaced-token detection with gradient-disentangled "
    "embedding sharing: the --preset/--config-json model (model_type "
    "deberta-v2, e.g. --preset deberta-v3-base) is the discriminator, the "
    "generator the same model with N layers (v3: half the depth); loss "
    "MLM + 10 x RTD; --export-hf DIR writes DIR/generator and "
    "DIR/discriminator",
  )
  g.add_argument(
    "--teacher",
    default=None,
    metavar="DIR|ID",
    help="distil from this Hugging Face model directory or hub id (with an MLM "
    "head), using its vocabulary unless --vocab is given; the student starts "
    "from every other teacher layer (with --distill tinybert, every k-th, k "
    "dividing the teacher's depth) unless --init-from is given",
  )
  g.add_argument(
    "--distill",
    default="distilbert",
    choices=("distilbert", "tinybert"),
    help="distillation losses: DistilBERT's, or those plus TinyBERT's hidden-state "
    "and attention terms (the student's depth must divide the teacher's)",
  )
  g.add_argument("--temperature", type=float, default=2.0, help="distillation temperature")


def setup(args, config, params, corpus, pc, teacher=None) -> tuple[Any, Any, Any, Any]:
  """`(config, params, data, objective)` for `loop.pretrain` from the parsed options;
  `teacher`: `(config, params)` of --teacher when the caller has read it already."""
  from bertjax.data import pretraining as P
  from bertjax.training import objectives as O

  extra = tuple(args.add_objective or ())
  if "sbo" in extra and pc.masking != "span":
    raise ValueError(f"--add-objective sbo needs --masking span, got --masking {pc.masking}")
  kw = {"batch_size": args.batch_size, "seed": args.seed}
  if "word_order" in extra:
    data = P.WordOrderIterator(corpus, pc, word_order_prob=args.word_order_prob, **kw)
  else:
    data = P.PretrainingIterator(corpus, pc, **kw)
  objective = list(O.resolve(pc.objective))
  objective += list(O.resolve("+".join(extra))) if extra else []
  if args.electra_generator_size is not None:
    if args.teacher or extra or pc.objective != "none":
      raise ValueError(
        "--electra-generator-size trains ELECTRA alone: use --objective none "
        "and no --add-objective or --teacher"
      )
    from bertjax.training import electra

    f = args.electra_generator_size
    if not 0 < f <= 1:
      raise ValueError(f"--electra-generator-size {f} must be in (0, 1]")
    if config.family.training.get("rtd") != "tables":
      raise ValueError(
        f"ELECTRA needs model_type='electra', got {config.model_type!r} "
        "(e.g. --preset electra-small)"
      )
    heads = max(1, round(config.num_attention_heads * f))
    gen = config.replace(
      hidden_size=heads * config.head_dim,
      num_attention_heads=heads,
      intermediate_size=max(1, round(config.intermediate_size * f)),
      embedding_size=config.embed_dim,
    )
    if params is not None:
      raise ValueError("--electra-generator-size starts from fresh weights; drop --init-from")
    return config, None, data, (electra.Electra(gen),)
  if args.rtd_generator_layers is not None:
    return _gdes(args, config, params, data, extra, pc)
  if args.teacher:
    import bertjax
    from bertjax.training import distill

    t_config, t_params = bertjax.from_hf(args.teacher) if teacher is None else teacher
    if t_config.vocab_size != config.vocab_size:
      raise ValueError(
        f"the teacher's vocab_size={t_config.vocab_size} differs from the "
        f"student's {config.vocab_size}; use the teacher's tokenizer (leave out "
        f"--vocab, or give --vocab {args.teacher})"
      )
    tinybert = args.distill == "tinybert"
    if params is None:
      student, params = _student(args, t_config, t_params, tinybert, "pretrain")
      config = student.replace(attention_impl=config.attention_impl, scan_unroll=config.scan_unroll)
    obj = distill.Distillation(t_config, t_params, temperature=args.temperature, tinybert=tinybert)
    if tinybert:
      obj.layer_map(config)  # a depth that does not fit is named before any compute
    objective = [o for o in objective if o.name != "mlm"] + [obj]  # its own MLM term
    params = {**params, **O.init_objective_params(objective, config, args.seed)}
  elif params is not None:
    params = {
      **params,
      **{
        k: v
        for k, v in O.init_objective_params(objective, config, args.seed).items()
        if k not in params
      },
    }
  return config, params, data, tuple(objective)


def _student(args, t_config, t_params, tinybert: bool, command: str):
  """`(config, params)` of a student started from the teacher's layers; says which."""
  from bertjax.training import distill

  given = [f for f, v in (("--preset", args.preset), ("--config-json", args.config_json)) if v]
  if given:
    raise ValueError(
      f"{given[0]} with --teacher: the student is built from the teacher's "
      f"layers, so {given[0]} would be ignored; drop it, or start the student "
      "from a model with --init-from"
    )
  layers = distill.default_student_layers(t_config, tinybert=tinybert)
  n = t_config.num_hidden_layers
  why = (
    "; TinyBERT's layer map needs a depth that divides the teacher's"
    if layers != distill.default_student_layers(t_config)
    else ""
  )
  print(
    f"{command}: the student starts from teacher layers {', '.join(map(str, layers))} "
    f"({len(layers)} of {n}{why}; --init-from DIR starts it from another model)",
    flush=True,
  )
  return distill.student_from_teacher(t_config, t_params, layers)


def add_finetune_args(p: argparse.ArgumentParser) -> None:
  """The `bertjax finetune` distillation options."""
  g = p.add_argument_group("distillation")
  g.add_argument(
    "--teacher",
    default=None,
    metavar="DIR",
    help="a Hugging Face model fine-tuned for this task: train on its soft "
    "targets too; the student starts from its every other layer unless "
    "--init-from is given",
  )
  g.add_argument(
    "--teacher-weight",
    type=float,
    default=0.5,
    metavar="ALPHA",
    help="weight of the soft-target term (1 - ALPHA on the labels)",
  )
  g.add_argument("--temperature", type=float, default=2.0, help="distillation temperature")


def finetune_setup(args, task: str, config, params) -> tuple[Any, Any, Any]:
  """`(config, params, objective)` for `finetune.finetune`; objective None without --teacher."""
  if not args.teacher:
    return config, params, None
  import bertjax
  from bertjax.training import distill

  t_config, t_params = bertjax.from_hf(args.teacher)
  if t_config.num_labels != config.num_labels:
    raise ValueError(
      f"the teacher has num_labels={t_config.num_labels}; the task has {config.num_labels}"
    )
  if t_config.vocab_size != config.vocab_size:
    raise ValueError(
      f"the teacher's vocab_size={t_config.vocab_size} differs from the "
      f"student's {config.vocab_size}; use the teacher's tokenizer"
    )
  obj = distill.TaskDistillation(
    t_config, t_params, task=task, temperature=args.temperature, alpha=args.teacher_weight
  )
  if not args.init_from:
    student, params = _student(args, t_config, t_params, False, "finetune")
    config = student.replace(
      attention_impl=config.attention_impl, dtype=config.dtype, scan_unroll=config.scan_unroll
    )
  return config, params, (obj,)


def _gdes(args, config, params, data, extra, pc):
  """`setup` for `--rtd-generator-layers`: DeBERTa-v3's RTD with GDES."""
  from bertjax.training import electra

  if args.teacher or extra or pc.objective != "none" or args.electra_generator_size is not None:
    raise ValueError(
      "--rtd-generator-layers trains DeBERTa-v3's RTD alone: use --objective "
      "none and no --add-objective, --teacher or --electra-generator-size"
    )
  if config.family.training.get("rtd") != "gdes":
    raise ValueError(
      f"--rtd-generator-layers needs model_type='deberta-v2', got "
      f"{config.model_type!r} (e.g. --preset deberta-v3-base)"
    )
  n = args.rtd_generator_layers
  if not 1 <= n <= config.num_hidden_layers:
    raise ValueError(
      f"--rtd-generator-layers {n} must be in 1..{config.num_hidden_layers} "
      "(the discriminator's depth)"
    )
  if params is not None:
    raise ValueError("--rtd-generator-layers starts from fresh weights; drop --init-from")
  return config, None, data, (electra.Electra(config.replace(num_hidden_layers=n)),)

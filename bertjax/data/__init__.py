"""Data: pretraining corpora and examples, UD CoNLL-U, GLUE and cloze sets."""

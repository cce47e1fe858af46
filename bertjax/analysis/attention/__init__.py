"""What attention heads look at: statistics (Clark et al. 2019), pattern types and
change under fine-tuning (Kovaleva et al. 2019), effective attention (Brunner et al. 2020),
positional overrides (Raganato et al. 2020) and DeBERTa's disentangled score terms."""

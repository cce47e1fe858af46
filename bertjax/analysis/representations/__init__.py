"""What the hidden states hold: features, probes (linear, MLP, structural), geometry
(anisotropy, CKA), cloze probes, outlier dimensions and sparse autoencoders."""

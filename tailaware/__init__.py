"""tailaware: predict web-scale retrieval metrics from a small uniform distractor sample."""

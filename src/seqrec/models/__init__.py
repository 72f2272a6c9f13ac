"""Models: architecture only (`forward(input_ids) -> hidden`), plus the baselines."""

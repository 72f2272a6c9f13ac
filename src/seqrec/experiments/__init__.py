"""Experiments: declarative specs (`spec`, the shipped `*.toml` beside it) and their runs (`run`),
ensembles, results files, HTML reports, plots and the attention analysis."""

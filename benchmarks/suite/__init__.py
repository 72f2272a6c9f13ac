"""The measurements of the benchmark programs (reproduce.py, analyses.py, speed.py, gpu.py):
one module a subcommand, each with its `main(argv)`."""

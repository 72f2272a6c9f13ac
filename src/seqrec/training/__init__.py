"""Training: a run set up (`setup`), its steps and loop (`step`, `loop`), a run opened, trained and
tested (`fit`), what a budget or a log changes in a config (`policy`), the check before anything
is written (`validation`), the losses, data-parallel ranks, and the run directory (`rundir`,
`checkpoint`)."""

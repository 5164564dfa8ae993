"""The workers: one module per stage (stage_table.py names which), each with run(params), called in its own process by
runner.run_stage (or inside doit, for the in-process ones). What several workers share is in support/."""

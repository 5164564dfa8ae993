"""One module per build stage; each has run(params) -> dict, called in its own process by runner.run_stage."""

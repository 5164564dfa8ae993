"""What several stage workers share, or a worker's large parts: the mixed-precision search (sensitivity, tune),
diagnose's words and plot. Never a worker itself (stage_table.py names the workers in build_rules/stages/)."""

"""A model's samples and what is judged on them: hooks, sample arrays and output metrics (samples), gates,
early verdicts, a graph's context-size estimate (context_size), where its shapes break (shape_break).

May import: errors, plumbing, quantization, configuration, stage_table, build_state.
"""

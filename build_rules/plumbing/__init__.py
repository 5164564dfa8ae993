"""Process plumbing that knows no model, chip or task: atomic file writes (files), frozen records (records),
installed tool versions, imports without a package's heavy __init__ (lean_imports), a native library's
stderr (native_stderr), a long stage's progress lines (progress), Ctrl-C and SIGTERM (interrupt), the tool's
numeric settings from the environment (env_settings).

May import: errors. Nothing else of build_rules.
"""

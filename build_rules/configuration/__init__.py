"""chips.toml and models/<name>/model.toml read, validated and made typed records: config (the loader),
config_types (the records), toml_table (reading TOML with the file and key in every error). Standard library
only: doit loads it on every run.

May import: errors, plumbing, quantization.
"""

"""Built-in model and GPU presets, as TOML data files read by planner.catalog."""

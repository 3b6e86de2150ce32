"""planner.profile: measured layer costs.

`schema` (the file format), `store` (the only reader and writer of profile files),
`measure` (the torch timing and memory code; the only module importing torch at module
level), `collectives` (communication under torchrun) and `lookup` (a cost-model compute
source that interpolates a profile). Import `measure` lazily: torch is optional.
"""

"""planner.profile: measured layer costs.

`schema` (the file format), `store` (the only reader and writer of profile files),
`measure` (the torch timing and memory code), `blocks` (the runtimes' transformer blocks
at TP-shard shapes), `counts` (FLOPs and operators per phase), `collectives` (the node's
communication, spawned or under torchrun), `node_comm` (measured collective curves for the
communication model; pure) and `lookup` (a cost-model compute source that interpolates a
profile). torch is imported only by measure, blocks, counts and collectives: import them
lazily, torch is optional.
"""

"""`planner models` and `planner gpus`: what is built in."""

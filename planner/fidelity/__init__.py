"""Fidelity checks: planner's predictions against measured runs and published figures."""

"""planner.cost"""

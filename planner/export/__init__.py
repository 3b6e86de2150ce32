"""planner.export"""

"""planner.search"""
